"""How long the Planner takes to plan one step as data parallelism grows, without servers.

Two measurements in the same run, on the same synthetic long-document steps (72 samples per
rank, lengths as in benchmarks/balance/balancers.py at a 32k context, cost a*l + b*l^2):

1. the balancer alone: ``partition(costs, dp, method=...)`` for greedy and karmarkar_karp
   against a plain heapq LPT (sort, then one ``heapreplace`` per item) on the same costs;
2. the whole pure planning function, ``planner.program.plan_step``: mixing over 6 sources,
   reading the synthetic sources' metadata through ``SourceFeed``, cost, both balancing
   levels (ranks, then each rank's microbatches) under the token capacity, and the stats.

Then a prefetch guidance table: how many steps ahead the Planner must run so that a step's
plan is never late, for a given step time and planning time.

    .venv/bin/python -m benchmarks.control_plane.plan_time  # dp 8 .. 4096, plot to docs/planner_scaling.png
    .venv/bin/python -m benchmarks.control_plane.plan_time --max-dp 512  # quicker
    # plan_step of another checkout side by side (alternating processes, same input, plan hashes):
    git archive 4d3fe2b flight_overlord | tar -x -C /tmp/before
    .venv/bin/python -m benchmarks.control_plane.plan_time --compare-with /tmp/before --compare-dp 1024 4096
    # the same, the steps as token budgets:
    .venv/bin/python -m benchmarks.control_plane.plan_time --compare-with /tmp/before --compare-unit tokens
    .venv/bin/python -m benchmarks.control_plane.plan_time --ratio-dp 4096 --reps 5  # plan_step / heapq LPT, CPU time
"""
from __future__ import annotations

import atexit
import hashlib
import heapq
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from benchmarks.balance.balancers import cost, sample_lengths
from benchmarks.common.benchlib import REPO, argument_parser, log, module_command, print_header, pyplot, save_plot
from flight_overlord.balance import lower_bound, partition
from flight_overlord.config import load_config
from flight_overlord.core.mixing import Mixer
from flight_overlord.core.order import RowGroupRef
from flight_overlord.planner.feed import SourceFeed
from flight_overlord.planner.program import plan_step
from flight_overlord.planner.strategy import Strategy

PER_RANK = 72
CONTEXT = 32768
SOURCES = {"web": 0.3, "books": 0.2, "code": 0.2, "papers": 0.1, "captions": 0.1, "chat": 0.1}
ROWS_PER_GROUP = 50_000


# ---------------------------------------------------------------------------------------------
# Synthetic planning input
# ---------------------------------------------------------------------------------------------

def synthetic_planner(dp: int, *, per_rank: int = PER_RANK, context: int = CONTEXT, microbatches: int | None = None,
                      method: str = "greedy", tokens_per_step: int | None = None, workdir: Path | None = None,
                      sources: dict[str, float] = SOURCES, seed: int = 0, row_groups: int = 2):
    """(feeds, mixer, strategy, weights) for ``plan_step`` over synthetic sources: no files, no servers.

    Every source is ``row_groups`` row groups of ``ROWS_PER_GROUP`` rows whose lengths follow the
    long-tailed mixture of ``benchmarks.balance.balancers``; a step draws ``dp * per_rank`` samples (or
    ``tokens_per_step``)."""
    mean_len = float(sample_lengths(np.random.default_rng(0), 100_000, context).mean())
    if microbatches is None:  # enough slots for the step's tokens with ~30% room
        microbatches = max(1, math.ceil(1.3 * per_rank * mean_len / context))
    if workdir is None:  # a config's files for this process only: removed when it exits
        workdir = Path(tempfile.mkdtemp(prefix="bench_planner-"))
        atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    for source in sources:  # the config wants files to exist; the feeds below never read them
        (workdir / source).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": ["x"]}), workdir / source / "part-0.parquet")
    batch = {"context_length": context, "microbatches": microbatches}
    batch.update({"tokens_per_step": tokens_per_step} if tokens_per_step else {"samples_per_step": dp * per_rank})
    raw = {"seed": seed, "data_root": str(workdir), "run_dir": str(workdir / "run"),
           "sources": [{"name": s, "paths": f"{s}/*.parquet", "weight": w} for s, w in sources.items()],
           "mesh": {"dp": dp}, "global_batch": batch, "balance": {"method": method},
           "cost": {"model": "attention", "a": 1.0, "b": 1.0 / (6 * 4096)}}
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    strategy = Strategy(load_config(path))
    rows = max(ROWS_PER_GROUP, 4 * dp * per_rank)

    def fetch(source: str):
        def meta(epoch: int, rg: RowGroupRef) -> dict:
            rng = np.random.default_rng([seed, epoch, rg.row_group, sum(map(ord, source))])
            return {"num_tokens": sample_lengths(rng, rg.num_rows, context).astype(np.int64)}
        return meta

    feeds = {s: SourceFeed(s, [RowGroupRef(f"{s}/part-{i}.parquet", 0, rows) for i in range(row_groups)], seed,
                           fetch(s))
             for s in sources}
    return feeds, Mixer(list(sources)), strategy, dict(sources)


def heapq_lpt(costs: np.ndarray, k: int) -> np.ndarray:
    """The plain baseline: items by descending cost, each onto the least-loaded bin of a heap."""
    order = np.argsort(-costs, kind="stable")
    heap = [(0.0, b) for b in range(k)]
    chosen = []
    for x in costs[order].tolist():
        load, b = heap[0]
        chosen.append(b)
        heapq.heapreplace(heap, (load + x, b))
    bin_of = np.empty(costs.size, dtype=np.int64)
    bin_of[order] = chosen
    return bin_of


def best_of(fn, reps: int) -> tuple[float, object]:
    """(best wall time in s, last result) over ``reps`` runs: the machine is shared, the best is the least disturbed."""
    times, result = [], None
    for _ in range(reps):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------

def balancer_row(dp: int, reps: int) -> dict:
    costs = cost(sample_lengths(np.random.default_rng([1, dp]), dp * PER_RANK, CONTEXT))
    bound = lower_bound(costs, dp)
    row = {"dp": dp, "items": costs.size}
    t, bin_of = best_of(lambda: heapq_lpt(costs, dp), reps)
    row["heapq"] = (t, float(np.bincount(bin_of, costs, minlength=dp).max() / bound))
    for method in ("greedy", "karmarkar_karp"):
        t, bins = best_of(lambda: partition(costs, dp, method=method), reps)
        row[method] = (t, max(float(costs[b].sum()) for b in bins) / bound)
    return row


def plan_step_row(dp: int, reps: int, steps: int) -> dict:
    """Mean time per step of ``plan_step`` over ``steps`` consecutive steps after an untimed first one
    (which also generates the synthetic sources' metadata), best of ``reps`` runs."""
    row = {"dp": dp}
    for method in ("greedy", "karmarkar_karp"):
        best, plan = math.inf, None
        for _ in range(reps):
            feeds, mixer, strategy, weights = synthetic_planner(dp, method=method)
            plan_step(0, feeds, mixer, strategy, weights)  # untimed: the feeds generate their first metadata
            start = time.perf_counter()
            for step in range(1, steps + 1):
                plan = plan_step(step, feeds, mixer, strategy, weights)
            best = min(best, (time.perf_counter() - start) / steps)
        row[method] = (best, plan.stats["max_rank_cost"] / plan.stats["lower_bound"], plan.stats["deferred"],
                       plan.microbatches)
    return row


def ratio_rows(dp: int, reps: int) -> None:
    """plan_step against heapq LPT of the same step's costs, alternating in this process, CPU time
    (``time.process_time``: on a shared machine the other processes' load counts less than in wall
    time), best of ``reps`` each: the whole step's price over the bare balancer."""
    print(f"\nplan_step vs heapq LPT at dp {dp} x {PER_RANK}, alternating, CPU time, best of {reps}:\n")
    print("| method | heapq LPT ms | plan_step ms | plan_step / heapq |")
    print("|---|---:|---:|---:|")
    costs = cost(sample_lengths(np.random.default_rng([1, dp]), dp * PER_RANK, CONTEXT))
    plans, heaps = {}, []
    for method in ("greedy", "karmarkar_karp"):
        feeds, mixer, strategy, weights = synthetic_planner(dp, method=method)
        plan_step(0, feeds, mixer, strategy, weights)
        best_heap = best_plan = math.inf
        for step in range(1, reps + 1):
            start = time.process_time()
            heapq_lpt(costs, dp)
            middle = time.process_time()
            plan = plan_step(step, feeds, mixer, strategy, weights)
            best_heap, best_plan = min(best_heap, middle - start), min(best_plan, time.process_time() - middle)
        plans[method], heaps = (best_plan, plan.stats), heaps + [best_heap]
        print(f"| {method} | {1000 * best_heap:.0f} | {1000 * best_plan:.0f} | {best_plan / best_heap:.2f} |")
    # the baseline's own noise on a shared machine: the least disturbed heapq LPT of the whole run
    print(f"\nagainst the run's best heapq LPT ({1000 * min(heaps):.0f} ms), and the plans' quality (last step):\n")
    print("| method | plan_step / best heapq | rank max/mean | rank max/lower bound | microbatch max/mean |")
    print("|---|---:|---:|---:|---:|")
    for method, (best_plan, stats) in plans.items():
        print(f"| {method} | {best_plan / min(heaps):.2f} | {stats['imbalance']:.6f} | "
              f"{stats['max_rank_cost'] / stats['lower_bound']:.6f} | {stats['microbatch_imbalance']:.4f} |")


def prefetch_needed(step_s: float, plan_s: float) -> int:
    """Steps the Planner must be ahead so that no trainer waits for a plan.

    Planning runs on its own thread while the trainers compute. The plan of step s+p is made
    while step s trains, so with p steps of prefetch the Planner has p step times to make a plan,
    plus one step of slack for the constructors to fetch and pack it: p = ceil(plan / step) + 1.
    Planning slower than a step (plan > step) falls behind whatever the prefetch: marked."""
    return math.ceil(plan_s / step_s) + 1


def prefetch_table(plan_times: dict[int, float]) -> list[str]:
    step_times = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
    lines = ["| dp | plan ms (greedy) | " + " | ".join(f"step {s * 1000:.0f} ms" for s in step_times) + " |",
             "|---:|---:|" + "---:|" * len(step_times)]
    for dp, plan_s in plan_times.items():
        cells = []
        for s in step_times:
            p = prefetch_needed(s, plan_s)
            cells.append(f"{p}" if plan_s < s else "behind")
        lines.append(f"| {dp} | {plan_s * 1000:.1f} | " + " | ".join(cells) + " |")
    return lines


def plot(balancer: list[dict], planning: list[dict], path: Path) -> None:
    plt = pyplot(path)
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    dps = [r["dp"] for r in balancer]
    for key, label, style in (("heapq", "heapq LPT (partition only)", "k--"),
                              ("greedy", "greedy partition (rounds)", "C0-o"),
                              ("karmarkar_karp", "karmarkar_karp partition", "C1-o")):
        ax.plot(dps, [1000 * r[key][0] for r in balancer], style, label=label)
    pdps = [r["dp"] for r in planning]
    ax.plot(pdps, [1000 * r["greedy"][0] for r in planning], "C2-s", label="plan_step, greedy (whole step)")
    ax.plot(pdps, [1000 * r["karmarkar_karp"][0] for r in planning], "C3-s", label="plan_step, karmarkar_karp")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"data-parallel ranks (x {PER_RANK} samples, ctx {CONTEXT})")
    ax.set_ylabel("time per step (ms)")
    ax.set_title("Planner: planning time per step vs data parallelism")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_plot(fig, path)


def one_run(dp: int, method: str, steps: int, unit: str = "samples") -> None:
    """Child of --compare-with: mean plan_step time over ``steps`` steps after an untimed one, and a
    hash of the plan records (the same seed must give the same plans in both trees). ``unit``
    "tokens": the same steps as a token budget (``tokens_per_step``), the mixer's other path."""
    import flight_overlord
    tokens = None
    if unit == "tokens":
        tokens = int(dp * PER_RANK * sample_lengths(np.random.default_rng(0), 100_000, CONTEXT).mean())
    feeds, mixer, strategy, weights = synthetic_planner(dp, method=method, tokens_per_step=tokens)
    plan_step(0, feeds, mixer, strategy, weights)
    total, digest = 0.0, hashlib.sha256()
    for step in range(1, steps + 1):
        start = time.perf_counter()
        plan = plan_step(step, feeds, mixer, strategy, weights)
        total += time.perf_counter() - start
        digest.update(json.dumps(plan.to_record(), sort_keys=True).encode())
    print(json.dumps({"mean_s": total / steps, "hash": digest.hexdigest()[:16],
                      "package": str(Path(flight_overlord.__file__).parent)}))


def compare(other: Path, dps: list[int], steps: int, unit: str = "samples") -> None:
    """plan_step of ``other`` (a flight_overlord source tree's parent) vs this tree, alternating."""
    print(f"\nplan_step, this tree vs {other} (one process each, alternating, {steps} steps after an untimed one, "
          f"steps counted in {unit}):\n")
    print("| dp | method | before ms | now ms | speed-up | same plans |")
    print("|---:|---|---:|---:|---:|---|")
    for dp in dps:
        for method in ("greedy", "karmarkar_karp"):
            out = {}
            for name, root in (("before", other), ("now", REPO)):
                # run in root: its flight_overlord is first on the child's path, the benchmark code is this tree's
                cmd = [*module_command(__spec__.name), "--one", str(dp), method, str(steps), unit]
                out[name] = json.loads(subprocess.run(cmd, cwd=root, check=True, capture_output=True,
                                                      text=True).stdout.strip().splitlines()[-1])
                log(f"dp {dp} {method} {name}: {out[name]}")
            b, n = out["before"], out["now"]
            print(f"| {dp} | {method} | {1000 * b['mean_s']:.0f} | {1000 * n['mean_s']:.0f} | "
                  f"{b['mean_s'] / n['mean_s']:.1f}x | {'yes' if b['hash'] == n['hash'] else 'NO'} |")


def main() -> None:
    if len(sys.argv) in (5, 6) and sys.argv[1] == "--one":
        return one_run(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), *sys.argv[5:])
    p = argument_parser(__doc__)
    p.add_argument("--max-dp", type=int, default=4096)
    p.add_argument("--reps", type=int, default=3, help="runs per point; the best is reported (default 3)")
    p.add_argument("--steps", type=int, default=3, help="consecutive plan_step calls per run (default 3)")
    p.add_argument("--plot", type=Path, default=REPO / "docs" / "planner_scaling.png")
    p.add_argument("--compare-with", type=Path, default=None,
                   help="only compare plan_step with the flight_overlord package under this directory")
    p.add_argument("--compare-dp", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--compare-unit", choices=("samples", "tokens"), default="samples",
                   help="steps counted in samples (default) or as a token budget")
    p.add_argument("--ratio-dp", type=int, default=None,
                   help="only time plan_step against heapq LPT at this dp (alternating, CPU time)")
    args = p.parse_args()
    print_header()
    if args.ratio_dp is not None:
        return ratio_rows(args.ratio_dp, args.reps)
    if args.compare_with is not None:
        if not (args.compare_with / "flight_overlord").is_dir():
            sys.exit(f"--compare-with {args.compare_with}: no flight_overlord package there")
        return compare(args.compare_with.resolve(), args.compare_dp, args.steps, args.compare_unit)
    dps = [dp for dp in (8, 32, 128, 512, 1024, 2048, 4096) if dp <= args.max_dp]
    balancer, planning = [], []
    for dp in dps:
        log(f"dp {dp}")
        balancer.append(balancer_row(dp, args.reps))
        planning.append(plan_step_row(dp, args.reps if dp < 1024 else 1, args.steps))
    print(f"\n{PER_RANK} samples per rank, ctx {CONTEXT}; best of {args.reps} runs (single process, no servers).\n")
    print("Balancer alone (`partition(costs, dp)`, rank level, refine on) vs a plain heapq LPT; time in ms, "
          "quality as max/lower bound:\n")
    print("| dp | items | heapq LPT ms | greedy ms | KK ms | greedy / heapq | KK / heapq "
          "| max/LB heapq | greedy | KK |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in balancer:
        h, g, k = r["heapq"], r["greedy"], r["karmarkar_karp"]
        print(f"| {r['dp']} | {r['items']} | {1000 * h[0]:.1f} | {1000 * g[0]:.1f} | {1000 * k[0]:.1f} "
              f"| {g[0] / h[0]:.2f} | {k[0] / h[0]:.2f} | {h[1]:.5f} | {g[1]:.5f} | {k[1]:.5f} |")
    print(f"\nWhole step (`plan_step`: mix 6 sources, read metadata, cost, ranks then microbatches under the "
          f"token capacity, stats); mean of {args.steps} consecutive steps after an untimed first one, "
          f"best of {args.reps} runs "
          f"(1 run from dp 1024):\n")
    print("| dp | samples | microbatches/rank | greedy ms | max/LB | deferred | KK ms | max/LB | deferred "
          "| per sample (greedy) | greedy / heapq LPT | KK / heapq LPT |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    heapq_ms = {r["dp"]: r["heapq"][0] for r in balancer}  # the rank level alone, plain heapq, same run
    for r in planning:
        g, k = r["greedy"], r["karmarkar_karp"]
        n = r["dp"] * PER_RANK
        print(f"| {r['dp']} | {n} | {g[3]} | {1000 * g[0]:.1f} | {g[1]:.4f} | {g[2]} | {1000 * k[0]:.1f} | "
              f"{k[1]:.4f} | {k[2]} | {1e6 * g[0] / n:.2f} us | {g[0] / heapq_ms[r['dp']]:.1f} "
              f"| {k[0] / heapq_ms[r['dp']]:.1f} |")
    print("\nPrefetch guidance: steps ahead (`prefetch`) so that no trainer waits for a plan = "
          "ceil(planning time / step time) + 1 (one step of slack for the constructors to fetch and pack); "
          "behind = planning takes longer than a step: the Planner falls further behind whatever the prefetch:\n")
    print("\n".join(prefetch_table({r["dp"]: r["greedy"][0] for r in planning})))
    if args.plot:
        plot(balancer, planning, args.plot)


if __name__ == "__main__":
    sys.exit(main())
