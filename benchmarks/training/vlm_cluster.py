"""``benchmarks/training/end_to_end.py --workload navit|coyo --cluster-ranks R``: the three scenarios of
``vlm_workload`` end to end on this machine, on as many trainer ranks as 2 cores drive.

A real ``LocalCluster`` over the corpus ``make-demo-data --navit``/``--coyo`` writes (one loader
actor per source, the images decoded at the constructors), R spawned trainers
(``TrainerClient``, prefetch 2) that sleep their step's ViT-2B then Llama-12B seconds times a time
scale and meet at a step barrier; with an image graph also between the two (the embeddings'
all-to-all, as ``vlm_workload.StepLoad`` models it). Same config and seed for the three scenarios,
so the same samples are drawn; the Planner places them:

- ``vanilla``: ``balance: none``, images with their sequence;
- ``backbone``: ``balance: greedy`` on the backbone cost, images with their sequence;
- ``hybrid``: ``strategies/vlm.py`` with the ViT-2B's ``encoder_b``: images over every rank.

Two figures per scenario: tokens/s of the simulated accelerators from what was delivered (per step
the slowest rank's simulated seconds, per phase with an image graph: the plan's quality, whatever
this machine's speed), and
the wall-clock tokens/s of the scaled run with its data-wait share (whether the data path kept up).
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common.benchlib import REPO, cluster_roots, log, write_config
from benchmarks.common.rank_processes import run_ranks
from benchmarks.training.cost import image_patches, sequence_lengths
from benchmarks.training.scenarios import Result, Scenario
from benchmarks.training.vlm_workload import LLM_12B, SCENARIOS, VISION, VIT_2B


def phase_seconds(mbs: list[dict], encoder_inputs) -> tuple[float, float]:
    """(ViT-2B, Llama-12B) seconds of a rank's step: the ViT over the images the image graph gave it
    (``encoder_inputs``), else over its own microbatches' images; the backbone over its sequences."""
    grids = [e["image_grid_thw"] for e in encoder_inputs] if encoder_inputs is not None else \
        [mb["image_grid_thw"] for mb in mbs]
    return VIT_2B.seconds(image_patches(grids)), sum(LLM_12B.seconds(sequence_lengths(mb)) for mb in mbs)


def vlm_rank(channel, planner: str, scenario: Scenario, warmup: int, steps: int, scale: float, barrier) -> None:
    """A trainer: per step, fetch; the ViT's sleep; with an image graph, a barrier (the embeddings'
    all-to-all); the backbone's sleep; the step barrier. Records benchmarks.training.end_to_end's eight columns per
    timed step, then the ViT's and the backbone's simulated seconds."""
    from flight_overlord.client.trainer import TrainerClient
    records = []
    with TrainerClient(planner, channel.rank, num_steps=warmup + steps, prefetch=2, encoder=scenario.encoder) as client:
        batches = iter(client)
        for i in range(warmup + steps):
            if i == warmup:
                channel.warm()
            t0 = time.monotonic()
            mbs, encoder_inputs = next(batches) if scenario.encoder else (next(batches), None)
            t1 = time.monotonic()
            vit, llm = phase_seconds(mbs, encoder_inputs)
            time.sleep(vit * scale)
            if scenario.encoder:
                barrier.wait(600)
            time.sleep(llm * scale)
            t2 = time.monotonic()
            barrier.wait(600)
            t3 = time.monotonic()
            if i >= warmup:
                tokens = sum(int(mb["num_tokens"]) for mb in mbs)
                records.append((t0, t1 - t0, t2 - t1, t3 - t2, t3, tokens, vit + llm, len(mbs), vit, llm))
    channel.result(records)


def ensure_corpus(workload: str, data_dir: Path, sources: int, rows: int) -> list[dict]:
    """The corpus (written unless every source is there already) and its config ``sources``."""
    from flight_overlord.demo.navit import coyo_profiles, make_coyo, make_navit, navit_profiles, source_entries
    profiles = navit_profiles(sources) if workload == "navit" else coyo_profiles()
    if not all(list((data_dir / p.name).glob("*.parquet")) for p in profiles):
        started = time.monotonic()
        if workload == "navit":
            make_navit(data_dir, sources, rows_per_source=rows)
        else:
            make_coyo(data_dir, rows_per_source=rows)
        log(f"corpus: {len(profiles)} {workload} sources x {rows} rows written in {time.monotonic() - started:.0f}s")
    return source_entries(profiles)


def scenario_config(args, tmp: Path, data_dir: Path, sources: list[dict], scenario: str, context: int) -> Path:
    sections = {"vision": {**VISION[args.workload], "decode_at": "constructor"},
                "cost": {"model": "attention", "a": 1.0, "b": LLM_12B.b / LLM_12B.a},
                "balance": {"method": "none" if scenario == "vanilla" else "greedy"}, "prefetch": 2}
    if scenario == "hybrid":
        sections["strategy"] = {"file": str(REPO / "configs" / "strategies" / "vlm.py"),
                                "options": {"encoder_b": VIT_2B.b / VIT_2B.a}}
    ranks = args.cluster_ranks
    return write_config(tmp / f"{args.workload}-{scenario}-{context}.yaml", data_dir, sources, ranks=ranks,
                        context_length=context, microbatches=args.microbatches,
                        tokens_per_step=int(args.fill * ranks * args.microbatches * context), seed=args.seed,
                        run_dir=tmp / f"run-{scenario}-{context}", **sections)


def time_scale(args, context: int) -> float:
    """Wall seconds per simulated second: a step of ``--cluster-step-seconds`` at the mean load."""
    simulated = args.microbatches * args.fill * context * LLM_12B.a * 1.3  # ~30 % more for attention and the ViT
    return args.cluster_step_seconds / simulated


def measure(args, tmp: Path, data_dir: Path, sources: list[dict], scenario: str, context: int) -> Result:
    from flight_overlord.deploy.launch import LocalCluster
    name = f"{args.workload}-{scenario}-{context // 1024}k"
    spec = Scenario(args.workload, scenario, phase_seconds, encoder=scenario == "hybrid")
    scale = time_scale(args, context)
    barrier = __import__("multiprocessing").get_context("spawn").Barrier(args.cluster_ranks)
    cluster = LocalCluster(scenario_config(args, tmp, data_dir, sources, scenario, context))
    try:
        started = time.monotonic()
        planner = cluster.start()
        roles = cluster_roots(cluster)
        log(f"[{name}] {len(roles)} role processes up in {time.monotonic() - started:.1f}s")
        per_rank = (planner, spec, args.warmup, args.steps, scale, barrier)
        records, _ = run_ranks(name, vlm_rank, [per_rank] * args.cluster_ranks, label="trainer",
                               extra_roots=lambda: roles, timeout=args.timeout)
    finally:
        cluster.stop()
    result = Result(name, spec, [np.array(r, dtype=np.float64) for r in records], scale)
    log(f"[{name}] simulated {simulated_tokens_per_s(result):,.0f} tokens/s, data wait {result.share(1):.1%}")
    return result


def simulated_tokens_per_s(r: Result) -> float:
    """Delivered tokens over the simulated step times: per step the slowest rank's ViT plus the
    slowest rank's backbone with an image graph (two phases), else the slowest rank's sum."""
    if r.scenario.encoder:
        steps = r.column(8).max(axis=0) + r.column(9).max(axis=0)
    else:
        steps = r.column(6).max(axis=0)
    return float(r.column(5).sum() / steps.sum())


def run_cluster(args, tmp: Path, data_dir: Path) -> dict:
    sources = ensure_corpus(args.workload, data_dir, args.sources or 306, args.cluster_rows)
    return {(context, scenario): measure(args, tmp, data_dir, sources, scenario, context)
            for context in args.contexts for scenario in SCENARIOS}


def report_cluster(results: dict, args) -> None:
    print(f"end to end on this machine: {args.cluster_ranks} trainer ranks, a LocalCluster over "
          f"{args.sources or 306 if args.workload == 'navit' else 5} sources, {args.warmup} warm-up + "
          f"{args.steps} timed steps per scenario")
    print()
    print("| context | scenario | tokens/s (simulated accelerators) | vs vanilla | max/mean rank compute "
          "| wall step ms | data wait | time scale |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for context in args.contexts:
        base = simulated_tokens_per_s(results[(context, "vanilla")])
        for scenario in SCENARIOS:
            r = results[(context, scenario)]
            print(f"| {context // 1024}K | {scenario} | {simulated_tokens_per_s(r):,.0f} | "
                  f"{simulated_tokens_per_s(r) / base:.2f}x | {r.compute_imbalance:.2f} | "
                  f"{r.step_times.mean() * 1e3:.0f} | {r.share(1):.1%} | {r.scale:.3g} |")
    print()
    for context in args.contexts:
        hybrid, vanilla = results[(context, "hybrid")], results[(context, "vanilla")]
        ratio = simulated_tokens_per_s(hybrid) / simulated_tokens_per_s(vanilla)
        print(f"speedup vs vanilla at {context // 1024}K: {ratio:.2f}x ({args.cluster_ranks} ranks, end to end)")


def end_to_end(args) -> dict[int, float]:
    """The scenarios on a LocalCluster per context (reported); per context, hybrid / vanilla simulated tokens/s."""
    print()
    with tempfile.TemporaryDirectory(prefix="vlm-cluster-") as tmp:
        measured = run_cluster(args, Path(tmp), args.data or Path(tmp) / "data")
    report_cluster(measured, args)
    return {c: simulated_tokens_per_s(measured[(c, "hybrid")]) / simulated_tokens_per_s(measured[(c, "vanilla")])
            for c in args.contexts}
