"""Closed-loop balancing: a cost model fitted from the trainers' timings vs a mis-set one vs the truth.

Simulated ranks (threads, 4 by default) train the long-tail 32K source (most samples short, a few
up to 32K tokens): each microbatch "computes" for the time a Llama-2-7B step would take on its
packed sequences (6*N FLOPs per token plus 12*layers*hidden per token pair at 160 TFLOP/s, times
``--time-scale``; a sleep, timed with ``ComputeTimer`` as a real trainer would), then every rank
waits at a barrier (the gradient all-reduce), so the step time is the slowest rank's. Three
clusters, same data and seed, one after another:

- ``mis-set``: the config's cost is linear (``b = 0``: tokens), not what the ranks spend;
- ``fitted``: the same linear config with ``cost.fit: true``: ranks report their measured seconds
  per microbatch, the Planner fits a and b (step s planned with the reports of steps <= s - lag);
- ``true``: the config carries the true b/a (what a perfectly tuned config would say).

Per step from the start: the step's wall time and simulated step time (the slowest rank's true
seconds) and the true-cost imbalance (slowest rank / mean rank), printed side by side and plotted
(``--plot``). Then the attribution: a second source is slowed on purpose
(``flight_overlord.faults.slow_sources``, its loader sleeps per call) and ``overlord status``'s starvation view
is printed for that run and for one without the delay.

    .venv/bin/python -m benchmarks.balance.cost_fit  # 4 ranks x 60 steps x 3 sides
    .venv/bin/python -m benchmarks.balance.cost_fit --steps 40 --plot docs/costfit_step_time.png

Left out: real kernels (the sleeps are the formula, plus the scheduler's jitter on a loaded machine),
the all-reduce's own time, pipeline and tensor parallelism.
"""
from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.common import benchlib
from benchmarks.common.benchlib import log

LONG, SHORT = "longtail_32k", "longtail_4k"
FLOPS = 160e12  # 400 TFLOP/s peak at 40 % MFU
TRUE_A = 6 * 6.74e9 / FLOPS            # seconds per token (Llama-2-7B, forward + backward)
TRUE_B = 12 * 32 * 4096 / FLOPS        # seconds per token pair in a sequence (attention)


@dataclass
class Side:
    name: str
    cost: dict
    step_wall: list[float] = field(default_factory=list)
    step_true: list[float] = field(default_factory=list)   # simulated: the slowest rank's true seconds
    imbalance: list[float] = field(default_factory=list)   # slowest rank / mean rank, true seconds
    fits: list[dict] = field(default_factory=list)          # the journaled cost_fit records
    reports: dict = field(default_factory=dict)             # (step, rank) -> seconds of the report call
    status: dict | None = None


def true_seconds(mb: dict) -> float:
    lengths = np.diff(mb["cu_seqlens"].numpy()).astype(np.float64)
    return float(TRUE_A * lengths.sum() + TRUE_B * (lengths * lengths).sum())


def rank_loop(planner: str, rank: int, steps: int, scale: float, barrier: threading.Barrier,
              out: dict, report: bool) -> None:
    from flight_overlord import ComputeTimer, TrainerClient
    timer = ComputeTimer()
    with TrainerClient(planner, rank, num_steps=steps, timeout=120) as client:
        for batch in client:
            step = batch[0]["step"]
            seconds = [true_seconds(mb) for mb in batch]
            for s in seconds:
                with timer.microbatch():
                    time.sleep(s * scale)
            out[(step, rank)] = sum(seconds)
            measured = timer.take()
            if report:
                sent = time.monotonic()
                client.report(step, compute_seconds=measured)
                out[("report", step, rank)] = time.monotonic() - sent
            barrier.wait(300)
            if rank == 0:
                out[("end", step)] = time.monotonic()


def run_side(side: Side, args, tmp: Path, data_dir: Path, sources: list[dict], slow: dict | None = None) -> Side:
    """``slow``: source -> seconds its loader sleeps per samples call (``faults.slow_sources``)."""
    from flight_overlord.deploy.launch import LocalCluster
    from flight_overlord.deploy.status import cluster_status
    from flight_overlord.faults import slow_sources_plugin
    from flight_overlord.journal import read_journal
    slug = re.sub(r"\W+", "-", side.name)
    plugins = {"plugins": [str(slow_sources_plugin(tmp, tmp / f"run-{slug}", slow))]} if slow else {}
    path = benchlib.write_config(tmp / f"{slug}.yaml", data_dir, sources, ranks=args.ranks,
                                 context_length=32768, microbatches=2,
                                 tokens_per_step=int(args.ranks * 2 * 32768 * 0.92),
                                 seed=1234, run_dir=tmp / f"run-{slug}", cost=side.cost,
                                 balance={"method": "greedy"}, prefetch=2, **plugins)
    with LocalCluster(path) as cluster:
        barrier, out = threading.Barrier(args.ranks), {}
        threads = [threading.Thread(target=rank_loop, args=(cluster.planner, r, args.steps, args.time_scale,
                                                            barrier, out, side.cost.get("fit", False)))
                   for r in range(args.ranks)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        side.status = cluster_status(cluster.planner)
    ends = [started] + [out[("end", s)] for s in range(args.steps)]
    side.step_wall = list(np.diff(ends))
    for s in range(args.steps):
        ranks = np.array([out[(s, r)] for r in range(args.ranks)])
        side.step_true.append(float(ranks.max() * args.time_scale))
        side.imbalance.append(float(ranks.max() / ranks.mean()))
    side.reports = {k[1:]: v for k, v in out.items() if k[0] == "report"}
    side.fits = [r["cost_fit"] for _, r in read_journal(tmp / f"run-{slug}" / "plan-journal.jsonl") if "cost_fit" in r]
    log(f"{side.name}: {args.steps} steps in {time.monotonic() - started:.1f}s")
    return side


def fit_at(side: Side, step: int) -> dict | None:
    """The fit in force at ``step`` (the last cost_fit record at or before it)."""
    records = [f for f in side.fits if f["step"] <= step]
    return records[-1] if records else None


def report(sides: list[Side], args) -> None:
    truth = TRUE_B / TRUE_A
    print(f"\ntrue model: a = {TRUE_A * 1e6:.1f} us/token, b = {TRUE_B * 1e9:.2f} ns/token^2, b/a = {truth:.3g} "
          f"(Llama-2-7B at 160 TFLOP/s; sleeps x {args.time_scale})")
    print("configs: mis-set = linear (b = 0); fitted = the same with cost.fit (lag 4); true = the true b/a\n")
    first, last = slice(0, args.lag), slice(args.steps // 2, args.steps)
    print(f"{'side':<10} {'simulated s, first ' + str(args.lag):>21} {'simulated s, 2nd half':>22} "
          f"{'wall s, 2nd half (median)':>26} {'imbalance, first ' + str(args.lag):>19} {'imbalance, 2nd half':>20}")
    for side in sides:
        print(f"{side.name:<10} {np.mean(side.step_true[first]):>21.3f} {np.mean(side.step_true[last]):>22.3f} "
              f"{np.median(side.step_wall[last]):>26.3f} {np.mean(side.imbalance[first]):>19.3f} "
              f"{np.mean(side.imbalance[last]):>20.3f}")
    reports = [v for s in sides for k, v in s.reports.items()]
    if reports:
        print(f"(a report call took {np.median(reports) * 1000:.1f} ms median, {max(reports) * 1000:.0f} ms at most)")
    fitted = next(s for s in sides if s.name == "fitted")
    base = {s.name: np.mean(s.step_true[last]) for s in sides}
    print(f"\nsimulated step time, 2nd half: fitted / mis-set = {base['fitted'] / base['mis-set']:.3f}, "
          f"fitted / true = {base['fitted'] / base['true']:.3f}")
    print("\nthe fitted b/a (journaled cost_fit records), against the truth:")
    for step in sorted({0, args.lag, args.lag + 1, 10, 20, 40, args.steps - 1} & set(range(args.steps))):
        fit = fit_at(fitted, step)
        if fit:
            ratio = fit["b"] / fit["a"] if fit["a"] else float("nan")
            print(f"  step {step:>3}: b/a = {ratio:.4g} ({ratio / truth:.0%} of the truth), from "
                  f"{fit['observations']} timings, {fit['rejected']} rejected")


def report_attribution(runs: list[Side]) -> None:
    from flight_overlord.deploy.status import starvation_lines
    print("\nstarvation attribution (overlord status):")
    for side in runs:
        print(f"  {side.name}:")
        lines = starvation_lines(side.status["starvation"])[1:] or ["    (no rank waited)"]
        for line in lines:
            print("  " + line)
        for rank, entry in sorted(side.status["starvation"]["ranks"].items()):
            top = sorted(entry["stages"].items(), key=lambda kv: -kv[1])[:3]
            print(f"    rank {rank}: waited {entry['waited']:.2f}s: " + ", ".join(f"{k} {v:.2f}s" for k, v in top))


def plot(sides: list[Side], path: Path) -> None:
    plt = benchlib.pyplot(path)
    if plt is None:
        return
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for side in sides:
        top.plot(side.step_true, label=side.name)
        bottom.plot(side.imbalance, label=side.name)
    top.set_ylabel("simulated step time (s)")
    bottom.set_ylabel("true-cost imbalance (max/mean)")
    bottom.set_xlabel("step")
    top.legend()
    top.set_title("linear config (b = 0) vs the same fitted online vs the true b/a")
    benchlib.save_plot(fig, path)
    log(f"plot: {path}")


def parse_args(argv=None):
    p = benchlib.argument_parser(__doc__)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--lag", type=int, default=4, help="cost.lag of the fitted side (default 4)")
    p.add_argument("--time-scale", type=float, default=0.01, help="wall seconds per simulated second (default 0.01)")
    p.add_argument("--slow", type=float, default=0.3, help="seconds the slowed source's loader sleeps per call")
    p.add_argument("--rows", type=int, default=20000, help="rows of the long-tail source (default 20000)")
    p.add_argument("--data", type=Path, help="corpus dir (generated there if missing; default: a temp dir)")
    p.add_argument("--plot", type=Path, help="write the per-step plot here (needs matplotlib)")
    return p.parse_args(argv)


def ensure_long_tail(data_dir: Path, rows: int) -> None:
    from flight_overlord.demo.long_tail import make_long_tail
    for name, longest in ((LONG, 32768), (SHORT, 4096)):
        if not list((data_dir / name).glob("*.parquet")):
            make_long_tail(data_dir, name, rows=rows, max_tokens=longest, seed=0)
            log(f"corpus: {name} written ({rows} rows)")


def main(argv=None) -> None:
    args = parse_args(argv)
    benchlib.print_header(f"; {args.ranks} ranks x {args.steps} steps per side")
    with benchlib.workspace("bench-costfit-", args.data, [], 0.0) as (tmp, data_dir):
        ensure_long_tail(data_dir, args.rows)
        one = [{"name": LONG, "loaders": 2}]
        sides = [run_side(Side(name, cost), args, tmp, data_dir, one) for name, cost in (
            ("mis-set", {"model": "attention", "a": 1.0, "b": 0.0}),
            ("fitted", {"model": "attention", "a": 1.0, "b": 0.0, "fit": True, "lag": args.lag}),
            ("true", {"model": "attention", "a": 1.0, "b": float(f"{TRUE_B / TRUE_A:.4g}")}))]
        report(sides, args)
        if args.plot:
            plot(sides, args.plot)
        two = [{"name": LONG, "weight": 0.8, "loaders": 2}, {"name": SHORT, "weight": 0.2}]
        short = argparse_namespace(args, steps=min(args.steps, 15))
        fitted = {"model": "attention", "a": 1.0, "b": 0.0, "fit": True, "lag": args.lag}
        runs = [run_side(Side("no delay", fitted), short, tmp, data_dir, two),
                run_side(Side(f"{SHORT} +{args.slow}s", fitted), short, tmp, data_dir, two,
                         slow={SHORT: args.slow})]
        report_attribution(runs)
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def argparse_namespace(args, **changes):
    import argparse
    return argparse.Namespace(**{**vars(args), **changes})


if __name__ == "__main__":
    main()
