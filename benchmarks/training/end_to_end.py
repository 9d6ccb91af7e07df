"""End-to-end training throughput with simulated accelerators: balanced vs unbalanced vs colocated.

One process per trainer rank (8 by default) takes each step's microbatches, "computes" each
microbatch for the time a real model would need on a real accelerator (a sleep, so the 2 cores
stay free for the data path), then waits at a step barrier for every rank (a
``multiprocessing.Barrier``, standing in for the gradient all-reduce). The step time is set by the
slowest rank, which is what balancing is about. Side by side in one run, same data and seed:

- ``flight_overlord balanced``: ``LocalCluster`` + ``TrainerClient`` (prefetch 2), the Planner
  balancing a*l + b*l^2 over ranks and microbatches (``balance: greedy``); for the VLM mix the
  hybrid strategy of ``configs/strategies/vlm.py`` (backbone balanced over DP, images over every
  rank for the vision encoder);
- ``flight_overlord unbalanced``: the same cluster with ``balance: none`` (samples fill the
  microbatches in arrival order, as a conventional loader packs them; images stay with their
  sequence);
- ``colocated``: benchmarks.delivery.throughput's colocated torch DataLoader per rank (2 workers, each opening every
  file of its sources, packing greedily in arrival order to the same microbatches per step).

The cost model (printed with every run): a dense 7B decoder (Llama-2-7B: 6.74e9 parameters,
32 layers, hidden 4096). Training FLOPs per microbatch = 6 * N * tokens + 12 * layers * hidden *
sum(l^2) over its packed sequences (attention scores and values, forward and backward, no causal
discount), at 400 TFLOP/s peak and 40 % MFU (160 TFLOP/s). The VLM mix adds a ViT encoder
(Qwen2-VL's, 675M parameters, 32 layers, hidden 1280) over each image's patches, attention
within each image. Simulated seconds are multiplied by ``--time-scale`` (per corpus by default) so
that a step takes a few hundred ms here; every figure in wall time is of the scaled simulation,
and the ratios are what carries over.

Scenarios are a table (``SCENARIOS``: a corpus, config overrides, and a compute function of a
rank's microbatches); ``--scenarios`` picks some. The static context-parallel ones
(``text-cp2-bshd``, ``text-cp2-thd``; ``text-cp4-*``: dp=2 x cp=4) run dp=4 x cp=2 and add ring
attention's KV traffic;
``text-hdp`` runs the same 8 ranks with dynamic CP groups (``distribute("HDP")``, 16K tokens per rank).
None of these is in the default set. ``vlm-backbone`` balances the VLM backbone only (images stay
with their sequence). The colocated DataLoader reads text sources only, so the VLM mix has no
colocated side.

Most of a run's wall time is starting things (clusters, 8 spawned trainers importing torch, the
DataLoader workers): 6.6 minutes with the defaults measured at a load average of 17-31 (10 at
30-57, with one scenario fewer); an otherwise idle machine should need about half (an estimate).

    .venv/bin/python -m benchmarks.training.end_to_end  # defaults: 7 scenarios x 20 steps
    .venv/bin/python -m benchmarks.training.end_to_end --steps 10 --scenarios text-balanced,text-unbalanced
    .venv/bin/python -m benchmarks.training.end_to_end --ranks 16 --data /tmp/bench-data

What it leaves out: real kernels (compute time is a formula, exact per microbatch, no jitter, no
kernel-efficiency drop for short sequences), the all-reduce's own time (the barrier is free),
pipeline and tensor parallelism, optimizer steps, host-to-device copies, and the trainer's own CPU
work beyond turning Arrow into tensors.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from benchmarks.common.benchlib import (
    REPO,
    argument_parser,
    cluster_roots,
    log,
    plan_imbalance,
    print_header,
    pyplot,
    save_plot,
    workspace,
    write_config,
)
from benchmarks.common.colocated import colocated_loader
from benchmarks.common.rank_processes import run_ranks
from benchmarks.training.cost import CP_LINK_BYTES_PER_S, CP_PASSES, FLOPS, KV_BYTES_PER_TOKEN, LLM, MFU, TFLOPS, VIT
from benchmarks.training.scenarios import CORPORA, DEFAULT_SCENARIOS, SCENARIOS, Result, Scenario

# ---------------------------------------------------------------------------------------------
# A rank: fetch, compute (sleep), barrier
# ---------------------------------------------------------------------------------------------

def train(channel, next_batch: Callable, compute: Callable, warmup: int, steps: int, scale: float, barrier,
          token_share: float = 1.0) -> None:
    """Per timed step: (start, data wait, compute, barrier wait, end, real tokens, simulated s, microbatches)."""
    records = []
    for i in range(warmup + steps):
        if i == warmup:
            channel.warm()  # every rank warm, then all start the timed phase together
        t0 = time.monotonic()
        mbs, encoder_inputs = next_batch()
        t1 = time.monotonic()
        seconds = compute(mbs, encoder_inputs)
        for s in seconds:
            time.sleep(s * scale)
        t2 = time.monotonic()
        barrier.wait(600)
        t3 = time.monotonic()
        if i >= warmup:
            tokens = token_share * sum(int(mb["num_tokens"]) for mb in mbs)
            records.append((t0, t1 - t0, t2 - t1, t3 - t2, t3, tokens, sum(seconds), len(mbs)))
    channel.result(records)


def overlord_rank(channel, planner: str, scenario: Scenario, warmup: int, steps: int, scale: float,
                  prefetch: int, barrier) -> None:
    from flight_overlord.client.trainer import TrainerClient

    with TrainerClient(planner, channel.rank, num_steps=warmup + steps, prefetch=prefetch,
                       encoder=scenario.encoder) as client:
        batches = iter(client)
        next_batch = (lambda: next(batches)) if scenario.encoder else (lambda: (next(batches), None))
        train(channel, next_batch, scenario.compute, warmup, steps, scale, barrier, scenario.token_share)


def colocated_rank(channel, scenario: Scenario, sources, data_dir: str, ranks: int, workers: int,
                   context_length: int, microbatches: int, seed: int, warmup: int, steps: int, scale: float,
                   barrier, samples_per_step: int | None = None) -> None:
    """``microbatches`` packed microbatches per step or, with ``samples_per_step``, that many samples
    packed greedily in arrival order into as many microbatches as they need."""
    if samples_per_step is None:
        batches = iter(colocated_loader(sources, data_dir, channel.rank, ranks, workers, context_length, seed))
        train(channel, lambda: ([next(batches) for _ in range(microbatches)], None), scenario.compute,
              warmup, steps, scale, barrier)
        return
    from flight_overlord.core.packing import pack
    batches = iter(colocated_loader(sources, data_dir, channel.rank, ranks, workers, context_length, seed,
                                    samples_per_batch=samples_per_step))  # a worker batches a step's samples

    def next_batch():
        bins, used = [[]], 0
        for _, tokens in next(batches):
            tokens = np.asarray(tokens)
            if bins[-1] and used + len(tokens) > context_length:
                bins.append([])
                used = 0
            bins[-1].append(tokens)
            used += len(tokens)
        packed = [pack(b, context_length) for b in bins]
        return [{"cu_seqlens": p.cu_seqlens, "num_tokens": p.num_tokens} for p in packed], None

    train(channel, next_batch, scenario.compute, warmup, steps, scale, barrier)


def samples_per_rank(raw: dict, data_dir: Path, ranks: int) -> int:
    """Samples per rank and step that carry the config's tokens_per_step on average: the sources'
    mean byte-token lengths (truncated to the context), mixed by their token-share weights."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    context = raw["global_batch"]["context_length"]
    weights, means = [], []
    for source in raw["sources"]:
        lengths = np.concatenate([pc.binary_length(pq.read_table(f, columns=["text"])["text"]).to_numpy()
                                  for f in sorted((data_dir / source["name"]).glob("*.parquet"))])
        weights.append(float(source.get("weight", 1.0)))
        means.append(float(np.minimum(lengths, context).mean()))
    weights = np.array(weights) / sum(weights)
    mean_length = 1.0 / float((weights / np.array(means)).sum())
    return max(1, round(raw["global_batch"]["tokens_per_step"] / ranks / mean_length))


# ---------------------------------------------------------------------------------------------
# Running a scenario
# ---------------------------------------------------------------------------------------------

def overlord_config(args, tmp: Path, data_dir: Path, name: str, scenario: Scenario) -> Path:
    corpus = CORPORA[scenario.corpus]
    raw = yaml.safe_load((REPO / "configs" / corpus.config).read_text())
    dp0 = (raw.get("mesh") or {}).get("dp", 1)  # the config's tokens_per_step is for that many DP ranks
    gb = raw["global_batch"]
    cp = scenario.config.get("mesh", {}).get("cp", 1)
    sections = {k: v for k, v in raw.items() if k not in ("seed", "data_root", "run_dir", "sources", "mesh",
                                                          "global_batch", "network")}
    strategy = sections.get("strategy")
    if isinstance(strategy, str):
        sections["strategy"] = str((REPO / "configs" / strategy).resolve())
    for key, value in {**corpus.overrides, **scenario.config}.items():
        if key == "mesh":
            continue
        if value is None:
            sections.pop(key, None)
        else:
            sections[key] = {**sections.get(key, {}), **value} if isinstance(value, dict) else value
    sections["prefetch"] = args.prefetch
    sections["cost"] = {"model": "attention", "a": 1.0, "b": float(f"{LLM.b / LLM.a:.4g}")}  # the simulated model's
    path = write_config(tmp / f"{name}.yaml", data_dir, raw["sources"], ranks=args.ranks // cp,
                        context_length=gb["context_length"], microbatches=gb["microbatches"],
                        tokens_per_step=int(gb["tokens_per_step"] * args.ranks / cp / dp0), seed=raw["seed"],
                        run_dir=tmp / f"run-{name}", **sections)
    config = yaml.safe_load(path.read_text())
    config["mesh"] = {"dp": args.ranks // cp, **scenario.config.get("mesh", {})}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_scenario(args, tmp: Path, data_dir: Path, name: str) -> Result:
    scenario = SCENARIOS[name]
    scale = args.time_scale or CORPORA[scenario.corpus].time_scale
    barrier = mp.get_context("spawn").Barrier(args.ranks)
    config = overlord_config(args, tmp, data_dir, name, scenario)
    notes = []
    if scenario.colocated:
        raw = yaml.safe_load(config.read_text())
        sources = [(s["name"], float(s.get("weight", 1.0)), 1) for s in raw["sources"]]
        gb = raw["global_batch"]
        per_sample = samples_per_rank(raw, data_dir, args.ranks) if scenario.equal_samples else None
        per_rank = (scenario, sources, str(data_dir), args.ranks, args.workers, gb["context_length"],
                    gb["microbatches"], raw["seed"], args.warmup, args.steps, scale, barrier, per_sample)
        records, sampler = run_ranks(name, colocated_rank, [per_rank] * args.ranks, label="rank",
                                     child_label="worker", timeout=args.timeout)
        notes.append(f"{args.ranks} ranks x {args.workers} DataLoader workers, "
                     + (f"{per_sample} samples per rank and step" if per_sample else
                        f"{gb['microbatches']} microbatches per rank and step"))
    else:
        from flight_overlord.deploy.launch import LocalCluster
        cluster = LocalCluster(config)
        try:
            started = time.monotonic()
            planner = cluster.start()
            roles = cluster_roots(cluster)
            log(f"[{name}] {len(roles)} role processes up in {time.monotonic() - started:.1f}s")
            per_rank = (planner, scenario, args.warmup, args.steps, scale, args.prefetch, barrier)
            records, sampler = run_ranks(name, overlord_rank, [per_rank] * args.ranks, label="trainer",
                                         extra_roots=lambda: roles, timeout=args.timeout)
            notes.append(plan_imbalance(planner, args.warmup, args.warmup + args.steps - 1))
        finally:
            cluster.stop()
        notes.append(f"{len(roles)} role processes + {args.ranks} trainers, prefetch {args.prefetch}")
    notes += sampler.summary()[1:]  # CPU shares (memory is benchmarks.memory.sources_ranks' business)
    result = Result(name, scenario, [np.array(r, dtype=np.float64) for r in records], scale, notes)
    log(f"[{name}] step {result.step_times.mean() * 1e3:.0f} ms, {result.tokens_per_s:.0f} tokens/s, "
        f"data wait {result.share(1):.2%}, barrier {result.share(3):.1%}")
    return result


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def report(results: list[Result], args) -> None:
    print("| scenario | side | step ms mean | p50 | p95 | tokens/s (wall) | tokens/s (simulated accelerators) "
          "| idle | of which data wait | barrier wait | step beyond slowest compute | compute max/mean |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        st = r.step_times * 1e3
        print(f"| {r.name} | {r.scenario.side} | {st.mean():.0f} | {np.percentile(st, 50):.0f} | "
              f"{np.percentile(st, 95):.0f} | {r.tokens_per_s:,.0f} | {r.tokens_per_s * r.scale:,.0f} | "
              f"{r.share(1) + r.share(3):.1%} | {r.share(1):.2%} | {r.share(3):.1%} | {r.stall:.2%} | "
              f"{r.compute_imbalance:.3f} |")
    print()
    for corpus in CORPORA:
        group = [r for r in results if r.scenario.corpus == corpus]
        if len(group) < 2:
            continue
        first = group[0]
        for r in group[1:]:
            print(f"- {corpus}: mean step time {r.name} / {first.name} = "
                  f"{r.step_times.mean() / first.step_times.mean():.2f} "
                  f"(p50: {np.median(r.step_times) / np.median(first.step_times):.2f}); "
                  f"tokens/s {first.name} / {r.name} = {first.tokens_per_s / r.tokens_per_s:.2f}")
    goals = [r for r in results if not r.scenario.colocated and args.prefetch == 2]
    for r in goals:
        met = "met" if r.share(1) < 0.01 else "NOT met"
        print(f"- data-wait idle under 1% of step time at prefetch 2, {r.name}: {r.share(1):.2%} ({met})")
    print()
    for r in results:
        for note in r.notes:
            print(f"- {r.name}: {note}")


def plot(results: list[Result], path: Path) -> None:
    plt = pyplot(path)
    if plt is None:
        return

    corpora = [c for c in CORPORA if any(r.scenario.corpus == c for r in results)]
    fig, axes = plt.subplots(len(corpora), 1, figsize=(9, 3.6 * len(corpora)), squeeze=False)
    for ax, corpus in zip(axes[:, 0], corpora):
        for r in results:
            if r.scenario.corpus == corpus:
                ax.plot(np.arange(len(r.step_times)), r.step_times * 1e3, marker=".",
                        label=f"{r.name}: {r.scenario.side} (mean {r.step_times.mean() * 1e3:.0f} ms)")
        ax.set_title(f"{corpus}: step time per step, {args_summary(results, corpus)}")
        ax.set_xlabel("timed step")
        ax.set_ylabel("step time (ms, scaled simulation)")
        ax.set_ylim(0, 1.5 * max(r.step_times.max() for r in results if r.scenario.corpus == corpus) * 1e3)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")  # above the curves: the y range leaves room
        ax.xaxis.get_major_locator().set_params(integer=True)
    save_plot(fig, path)


def args_summary(results: list[Result], corpus: str) -> str:
    r = next(r for r in results if r.scenario.corpus == corpus)
    return f"{len(r.records)} ranks, time scale {r.scale:g}"


def parse_args(argv=None):
    p = argument_parser(__doc__)
    p.add_argument("--ranks", type=int, default=8, help="trainer ranks (default 8)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per scenario (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--prefetch", type=int, default=2, help="TrainerClient prefetch (default 2)")
    p.add_argument("--workers", type=int, default=2, help="colocated DataLoader workers per rank (default 2)")
    p.add_argument("--time-scale", type=float, default=None,
                   help="wall seconds per simulated second (default per corpus: "
                        + ", ".join(f"{k} {c.time_scale:g}" for k, c in CORPORA.items()) + ")")
    p.add_argument("--scenarios", default=DEFAULT_SCENARIOS,
                   help=f"comma-separated, from: {', '.join(SCENARIOS)} (default {DEFAULT_SCENARIOS})")
    p.add_argument("--long-tail-rows", type=int, default=20000, help="rows of the long-tail source (default 20000)")
    p.add_argument("--scale", type=float, default=0.25, help="demo corpus scale for the VLM mix (default 0.25)")
    p.add_argument("--data", type=Path, help="corpus dir (generated there if missing; default: a temp dir)")
    p.add_argument("--plot", type=Path, default=REPO / "docs" / "training_step_time.png")
    p.add_argument("--timeout", type=float, default=600.0, help="per scenario, against hangs (seconds)")
    from benchmarks.training import vlm_workload
    vlm_workload.add_arguments(p)
    args = p.parse_args(argv)
    if args.workload:
        vlm_workload.check_arguments(p, args)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(unknown)} (scenarios: {', '.join(SCENARIOS)})")
    if min(args.ranks, args.steps, args.prefetch) < 1 or args.warmup < 0 or args.workers < 0:
        p.error("--ranks, --steps, --prefetch must be >= 1; --warmup, --workers >= 0")
    if args.time_scale is not None and not args.time_scale > 0:
        p.error("--time-scale must be > 0")
    for name in args.scenarios:
        cp = SCENARIOS[name].config.get("mesh", {}).get("cp", 1)
        if args.ranks % cp:
            p.error(f"--ranks {args.ranks} is not a multiple of scenario {name}'s cp={cp}")
    return args


def run_workload(args) -> None:
    """``--workload``: the paper's VLM setting planned in-process, then (``--cluster-ranks``) end to end here."""
    from benchmarks.training import vlm_cluster, vlm_workload
    print_header()
    results = vlm_workload.run(args)
    end_to_end = vlm_cluster.end_to_end(args) if args.cluster_ranks else None
    plot = args.workload_plot or REPO / "docs" / f"vlm_{args.workload}_speedup.png"
    vlm_workload.plot(results, args, plot, end_to_end)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.workload:  # the paper's VLM setting: planned in-process, at any rank count
        return run_workload(args)
    print_header()
    print("simulated accelerator: "
          f"{TFLOPS / 1e12:.0f} TFLOP/s peak at {MFU:.0%} MFU = {FLOPS / 1e12:.0f} TFLOP/s; per microbatch "
          "a*tokens + b*sum(l^2) over its packed sequences")
    print(f"- {LLM.describe()}")
    print(f"- {VIT.describe()} (per image, over its patches)")
    print(f"- ring attention (CP scenarios): {CP_PASSES} x (cp-1) x held tokens x {KV_BYTES_PER_TOKEN // 1024} KiB "
          f"(K,V bf16 x {LLM.layers} layers) at {CP_LINK_BYTES_PER_S / 1e9:.0f} GB/s, not overlapped")
    scales = {c: args.time_scale or CORPORA[c].time_scale for c in {SCENARIOS[n].corpus for n in args.scenarios}}
    print(f"time scale (wall s per simulated s): {', '.join(f'{c} {s:g}' for c, s in sorted(scales.items()))}; "
          f"{args.ranks} ranks, {args.warmup} warm-up + {args.steps} timed steps per scenario")
    images = any(CORPORA[SCENARIOS[n].corpus].images for n in args.scenarios)
    text = any(not CORPORA[SCENARIOS[n].corpus].images for n in args.scenarios)
    names = ["imagecaps", "interleaved", "captions", "longdocs", "qa"] if images else []
    with workspace("bench-training-", args.data, names, args.scale) as (tmp, data_dir):
        if text:
            from flight_overlord.demo.long_tail import long_tail_name, make_long_tail
            name = long_tail_name(32768)
            if not list((data_dir / name).glob("*.parquet")):
                make_long_tail(data_dir, name, rows=args.long_tail_rows, max_tokens=32768, seed=0)
                log(f"corpus: {name} written ({args.long_tail_rows} rows)")
        results = [run_scenario(args, tmp, data_dir, name) for name in args.scenarios]
        print()
        report(results, args)
        plot(results, args.plot)


if __name__ == "__main__":
    main()
