"""Dynamic CP groups (HDP) vs static context parallelism on a long-tail corpus, simulated accelerators.

A pure simulation over the Planner's own code: the same long-tail source (its real Parquet
lengths, in the Planner's seeded order), the same tokens per step and ranks (8 by default); each
step is planned by ``plan_step`` exactly as a Planner would, then every rank's work per microbatch
is computed from what it would hold:

- ``static-cp8-bshd``: dp x cp=8 (cp sized for the longest sample at 32K per rank), every
  microbatch one packed buffer of context_length tokens per DP group, split whole across its 8
  ranks (chunks c and 15-c of the buffer), balanced over DP groups and microbatches;
- ``static-cp8-thd``: the same, each sequence padded to a multiple of 16 and split on its own
  (TransformerEngine's THD split); ``static-cp8-thd-unbalanced``: that, packed in arrival order
  as a conventional loader does (``balance: none``);
- ``hdp-minimal``: the same with ``widen=False``: every sample on its smallest group;
- ``hdp``: ``configs/long_context_hdp.yaml``: dp x cp = (ranks/4) x 4, ``distribute("HDP",
  max_tokens_per_rank=32768)``: each sample on a power-of-two group of ranks from its length.

Per rank and microbatch (the benchmarks.training.end_to_end cost model, Llama-2-7B at 160 TFLOP/s): a * held
positions + 2b * causal (query, key) pairs of the positions it holds (so a sequence's ranks add up
to b * l^2), plus ring attention's KV traffic for every sequence on g > 1 ranks: CP_PASSES x (g-1)
x held positions x KV_BYTES_PER_TOKEN / CP_LINK_BYTES_PER_S, not overlapped. CP groups synchronise
inside a microbatch, so a microbatch ends when its slowest rank does; the step is the sum over
microbatches. Idle = 1 - busy / (ranks x step). CP volume = bytes every rank sends around its rings.
Efficiency = the step's useful compute (a*l + b*l^2 of its samples, spread evenly, no
communication) / (ranks x step time): unlike tokens/s it does not depend on which samples a
scenario happened to defer past the last step (long ones cost more per token), so the ratio of
two scenarios' efficiencies is their speedup on the same work.
Planning time = wall time of ``plan_step`` (mix, cost, place) on this machine.

    .venv/bin/python -m benchmarks.balance.hdp  # 30 steps, ~1 min
    .venv/bin/python -m benchmarks.balance.hdp --steps 10 --data data/demo

Left out: real kernels and their efficiency on short sequences, overlap of ring communication with
compute, the gradient all-reduce, pipeline/tensor parallelism.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from benchmarks.common.benchlib import REPO, argument_parser, log, print_header, pyplot, save_plot
from flight_overlord.config import load_config
from flight_overlord.core import hdp
from flight_overlord.core.context_parallel import token_ranges
from flight_overlord.core.mixing import Mixer
from flight_overlord.core.order import RowGroupRef
from flight_overlord.demo.long_tail import long_tail_name, make_long_tail
from flight_overlord.planner.feed import SourceFeed
from flight_overlord.planner.hdp import hdp_groups
from flight_overlord.planner.program import plan_step
from flight_overlord.planner.strategy import Strategy, load_strategy

FLOPS = 400e12 * 0.40                       # 400 TFLOP/s peak at 40 % MFU
PARAMS, LAYERS, HIDDEN = 6.74e9, 32, 4096   # Llama-2-7B
A, B = 6 * PARAMS / FLOPS, 12 * LAYERS * HIDDEN / FLOPS  # s per token, s per (query, key) pair x 2
KV_BYTES_PER_TOKEN = 2 * HIDDEN * 2 * LAYERS  # K and V, bf16, every layer
CP_LINK_BYTES_PER_S = 100e9
CP_PASSES = 3  # forward sends K,V around the ring; backward sends K,V and dK,dV
MAX_TOKENS = 262144


def held_and_pairs(starts: np.ndarray, ends: np.ndarray, ranges: list[int]) -> tuple[int, float]:
    """Positions a rank holds of sequences [starts, ends) of a buffer, and their causal pairs."""
    held, pairs = 0, 0.0
    for lo, hi in zip(ranges[::2], ranges[1::2]):
        x, y = np.maximum(lo, starts), np.minimum(hi, ends)
        ok = y > x
        n = (y - x)[ok]
        held += int(n.sum())
        pairs += float((n * ((x[ok] + y[ok] - 1) / 2 - starts[ok] + 1)).sum())
    return held, pairs


LINK = {"bytes_per_s": CP_LINK_BYTES_PER_S}  # --link-gb-s sets it


def seconds(held: int, pairs: float, group: int) -> tuple[float, float]:
    """(busy seconds, bytes sent around the ring) of one rank for what it holds of one CP group."""
    sent = CP_PASSES * (group - 1) * held * KV_BYTES_PER_TOKEN
    return A * held + 2 * B * pairs + sent / LINK["bytes_per_s"], sent


def static_bshd_work(plan, cp: int) -> tuple[np.ndarray, float]:
    """[microbatches, dp x cp] busy seconds and bytes sent, for a static CP plan whose packed buffer
    is split whole: CP rank r holds chunks r and 2cp-1-r of its DP group's buffer."""
    busy, sent = np.zeros((plan.microbatches, plan.num_buckets * cp)), 0.0
    for dp in range(plan.num_buckets):
        for m, picks in enumerate(plan.bucket_bins(dp)):
            ends = np.cumsum(np.array([p.tokens for p in picks], dtype=np.int64))
            starts = ends - np.array([p.tokens for p in picks], dtype=np.int64)
            for r in range(cp):
                held, pairs = held_and_pairs(starts, ends, token_ranges(plan.capacity, cp, r, "load_balanced"))
                busy[m, dp * cp + r], bytes_ = seconds(held, pairs, cp)
                sent += bytes_
    return busy, sent


def thd_seq(length: int, group: int, rank: int) -> tuple[int, float]:
    """Held positions and causal pairs of CP rank ``rank`` of ``group`` for one sequence (THD split)."""
    slot = int(hdp.slots([length], [group])[0])
    ranges = [0, slot] if group == 1 else token_ranges(slot, group, rank, "load_balanced")
    return held_and_pairs(np.array([0]), np.array([slot]), ranges)


def static_thd_work(plan, cp: int) -> tuple[np.ndarray, float]:
    """The same with every sequence padded to 2cp and split on its own (THD)."""
    busy, sent = np.zeros((plan.microbatches, plan.num_buckets * cp)), 0.0
    for dp in range(plan.num_buckets):
        for m, picks in enumerate(plan.bucket_bins(dp)):
            for r in range(cp):
                held, pairs = 0, 0.0
                for p in picks:
                    h, q = thd_seq(p.tokens, cp, r) if p.tokens else (0, 0.0)
                    held, pairs = held + h, pairs + q
                busy[m, dp * cp + r], bytes_ = seconds(held, pairs, cp)
                sent += bytes_
    return busy, sent


def hdp_work(plan) -> tuple[np.ndarray, float]:
    """[microbatches, ranks] busy seconds and bytes sent, for an HDP plan: each rank's sequences, each
    on its own group (read back from the bins as a constructor gets them)."""
    groups = hdp_groups(plan, range(plan.num_buckets))
    busy, sent = np.zeros((plan.microbatches, plan.num_buckets)), 0.0
    for rank in range(plan.num_buckets):
        for m, picks in enumerate(plan.bucket_bins(rank)):
            for p, (size, first) in zip(picks, groups[str(rank)][m]):
                held, pairs = thd_seq(p.tokens, size, rank - first)
                t, bytes_ = seconds(held, pairs, size)
                busy[m, rank] += t
                sent += bytes_
    return busy, sent


@dataclass
class Scenario:
    name: str
    side: str
    cp: int                       # static CP size (8: a 256K sample at 32K per rank), or the HDP mesh's cp
    hdp: bool
    cp_format: str = "thd"
    options: dict | None = None  # strategy options over the config's
    balance: str = "greedy"      # static scenarios: the Planner's balancing, or none (arrival order)


SCENARIOS = [
    Scenario("static-cp8-bshd", "static CP=8, whole-buffer split (bshd)", 8, False, "bshd"),
    Scenario("static-cp8-thd-unbalanced", "static CP=8, thd, packed in arrival order (balance: none)", 8, False, "thd",
             balance="none"),
    Scenario("static-cp8-thd", "static CP=8, per-sequence split (thd)", 8, False, "thd"),
    Scenario("hdp-minimal", "HDP, smallest groups only (widen=False)", 4, True, options={"widen": False}),
    Scenario("hdp", "HDP, groups per sample (long_context_hdp.yaml)", 4, True),
]


def feeds_over(data_dir: Path, source: str, seed: int, context_length: int) -> dict[str, SourceFeed]:
    """The source as the Planner sees it: its row groups and each row's byte-token length."""
    files = sorted((data_dir / source).glob("*.parquet"))
    handles = {f.relative_to(data_dir).as_posix(): pq.ParquetFile(f) for f in files}
    refs = [RowGroupRef(name, i, h.metadata.row_group(i).num_rows) for name, h in handles.items()
            for i in range(h.num_row_groups)]

    def fetch(epoch, rg):
        text = handles[rg.file].read_row_group(rg.row_group, columns=["text"]).column(0)
        return {"num_tokens": np.minimum(pc.binary_length(pc.cast(text, "binary")).to_numpy(zero_copy_only=False),
                                         context_length).astype(np.int64)}
    return {source: SourceFeed(source, refs, seed, fetch)}


def scenario_config(tmp: Path, data_dir: Path, scenario: Scenario, ranks: int, microbatches: int) -> Path:
    """configs/long_context_hdp.yaml (8 ranks x 2 microbatches) on ``ranks`` ranks and ``microbatches``,
    tokens per step scaled with the slots."""
    raw = yaml.safe_load((REPO / "configs" / "long_context_hdp.yaml").read_text())
    raw["data_root"], raw["run_dir"] = str(data_dir), str(tmp / f"run-{scenario.name}")
    raw["mesh"] = {"dp": ranks // scenario.cp, "cp": scenario.cp, "cp_format": scenario.cp_format}
    gb = raw["global_batch"]
    gb["tokens_per_step"] = int(gb["tokens_per_step"] * ranks / 8 * microbatches / gb["microbatches"])
    gb["microbatches"] = microbatches
    if scenario.hdp:
        raw["strategy"]["file"] = str(REPO / "configs" / raw["strategy"]["file"])
        raw["strategy"]["options"] = {**raw["strategy"].get("options", {}), **(scenario.options or {})}
    else:
        raw.pop("strategy")
        raw["balance"] = {"method": scenario.balance}
    path = tmp / f"{scenario.name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def run(scenario: Scenario, config: Path, data_dir: Path, steps: int) -> dict:
    cfg = load_config(config)
    strategy = load_strategy(cfg) if scenario.hdp else Strategy(cfg).plan()
    source = cfg.sources[0].name
    feeds, mixer = feeds_over(data_dir, source, cfg.seed, cfg.global_batch.context_length), Mixer([source])
    step_s, idle, sent, planning, tokens, useful, deferred = [], [], [], [], [], [], 0
    for step in range(steps):
        t0 = time.perf_counter()
        plan = plan_step(step, feeds, mixer, strategy, {source: 1.0})
        planning.append(time.perf_counter() - t0)
        if scenario.hdp:
            busy, bytes_ = hdp_work(plan)
        elif cfg.mesh.cp_format == "thd":
            busy, bytes_ = static_thd_work(plan, cfg.mesh.cp)
        else:
            busy, bytes_ = static_bshd_work(plan, cfg.mesh.cp)
        t = float(busy.max(axis=1).sum())
        step_s.append(t)
        idle.append(1 - busy.sum() / (busy.shape[1] * t))
        sent.append(bytes_)
        tokens.append(sum(plan.stats["tokens"].values()))
        lengths = np.array([p.tokens for p in {p.ref.key: p for b in plan.bins for p in b}.values()], dtype=np.float64)
        # ideal: no comm, no idle
        useful.append(float((A * lengths + B * lengths * (lengths + 1)).sum()) / busy.shape[1])
        deferred += plan.stats["deferred"]
    return {"step": np.array(step_s), "idle": np.array(idle), "sent": np.array(sent),
            "planning": np.array(planning), "tokens": np.array(tokens), "useful": np.array(useful),
            "deferred": deferred}


def main(argv=None) -> None:
    p = argument_parser(__doc__)
    p.add_argument("--steps", type=int, default=30, help="steps per scenario (default 30)")
    p.add_argument("--ranks", type=int, default=8, help="ranks of the DP x CP domain, a multiple of 8 (default 8)")
    p.add_argument("--microbatches", type=int, default=2, help="microbatches per rank and step (default 2)")
    p.add_argument("--link-gb-s", type=float, default=CP_LINK_BYTES_PER_S / 1e9,
                   help=f"ring attention link per rank, GB/s (default {CP_LINK_BYTES_PER_S / 1e9:g}; "
                        "~25 for inter-node)")
    p.add_argument("--rows", type=int, default=20000, help="rows of the long-tail source if generated (default 20000)")
    p.add_argument("--data", type=Path,
                   help="a data dir holding longtail_256k (generated there if missing; default: a temp dir)")
    p.add_argument("--tail-fraction", type=float, default=None,
                   help="share of long (16K-256K) rows when generating (default: the generator's, 4%%); "
                        "always generates into a temp dir")
    p.add_argument("--plot", type=Path, default=REPO / "docs" / "hdp_efficiency.png")
    args = p.parse_args(argv)
    if args.steps < 1 or args.microbatches < 1:
        p.error("--steps and --microbatches must be >= 1")
    if args.ranks < 8 or args.ranks % 8:
        p.error(f"--ranks must be a multiple of 8 (static CP=8 holds a 256K sample at 32K per rank), got {args.ranks}")
    if not args.link_gb_s > 0:
        p.error("--link-gb-s must be > 0")
    LINK["bytes_per_s"] = args.link_gb_s * 1e9
    print_header()
    print(f"simulated accelerator: Llama-2-7B at {FLOPS / 1e12:.0f} TFLOP/s: a = {A * 1e6:.1f} us/token, "
          f"2b = {2 * B * 1e9:.2f} ns per causal (query, key) pair; ring attention {CP_PASSES} x (g-1) x held x "
          f"{KV_BYTES_PER_TOKEN // 1024} KiB at {args.link_gb_s:g} GB/s, not overlapped")
    with tempfile.TemporaryDirectory(prefix="bench-hdp-") as tmp:
        tmp = Path(tmp)
        data_dir = args.data.resolve() if args.data and args.tail_fraction is None else tmp / "data"
        name = long_tail_name(MAX_TOKENS)
        if not list((data_dir / name).glob("*.parquet")):
            shape = {} if args.tail_fraction is None else {"tail_fraction": args.tail_fraction}
            make_long_tail(data_dir, name, rows=args.rows, max_tokens=MAX_TOKENS, seed=0, **shape)
            log(f"corpus: {data_dir / name} written ({args.rows} rows, {shape or 'default shape'})")
        results = {}
        for s in SCENARIOS:
            log(f"[{s.name}] planning and simulating {args.steps} steps")
            results[s.name] = run(s, scenario_config(tmp, data_dir, s, args.ranks, args.microbatches), data_dir,
                                  args.steps)
    print(f"{args.steps} steps per scenario, same data and order, {results['hdp']['tokens'].mean():,.0f} real tokens "
          f"per step, {args.ranks} ranks x {args.microbatches} microbatches x 32K per rank; "
          f"static: dp{args.ranks // 8} x cp8, HDP: dp{args.ranks // 4} x cp4")
    print()
    print("| scenario | side | step s (simulated) mean | p95 | tokens/s | efficiency | idle | CP volume GB/step | "
          "planning ms/step | planning / step |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in SCENARIOS:
        r = results[s.name]
        print(f"| {s.name} | {s.side} | {r['step'].mean():.2f} | {np.percentile(r['step'], 95):.2f} | "
              f"{r['tokens'].sum() / r['step'].sum():,.0f} | {r['useful'].sum() / r['step'].sum():.1%} | "
              f"{r['idle'].mean():.1%} | {r['sent'].mean() / 1e9:.1f} | "
              f"{r['planning'].mean() * 1e3:.1f} | {r['planning'].mean() / r['step'].mean():.2%} |")
    print()
    base = results["hdp"]["step"].mean()
    for s in SCENARIOS[:-1]:
        r, h = results[s.name], results["hdp"]
        efficiency = (h['useful'].sum() / h['step'].sum()) / (r['useful'].sum() / r['step'].sum())
        print(f"- hdp vs {s.name}: {efficiency:.2f}x "
              f"the efficiency (same work in that much less time), tokens/s "
              f"{(h['tokens'].sum() / h['step'].sum()) / (r['tokens'].sum() / r['step'].sum()):.2f}x, "
              f"step time {r['step'].mean() / base:.2f}x shorter, CP volume per token "
              f"{(r['sent'].sum() / r['tokens'].sum()) / max(h['sent'].sum() / h['tokens'].sum(), 1):.1f}x lower")
    print("- deferred samples (planned into a later step): "
          + ", ".join(f"{s.name} {results[s.name]['deferred']}" for s in SCENARIOS))
    plot(results, args.plot, f"long-tail 256K corpus, {args.ranks} ranks x {args.microbatches} microbatches: "
                             "static CP=8 vs HDP")


def plot(results: dict, path: Path, title: str) -> None:
    plt = pyplot(path)
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for s in SCENARIOS:
        r = results[s.name]
        eff = r["useful"] / r["step"]
        ax.plot(np.arange(len(eff)), eff * 100, marker=".",
                label=f"{s.name} ({r['useful'].sum() / r['step'].sum():.1%} overall)")
    ax.set_xlabel("step")
    ax.set_ylabel("efficiency: useful compute / rank time (%)")
    ax.set_title(title)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_plot(fig, path)


if __name__ == "__main__":
    main()
