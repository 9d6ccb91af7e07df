"""Steps in flight to a rank: sent by its constructor (and counted served there), not yet yielded to
the training loop: in gRPC's buffers, in the client's queue, or in its prefetch thread's hand.

Two runs of the same config (`LocalCluster` over the demo corpus, every rank through a TrainerClient
with `prefetch` --prefetch, a training loop of --step-ms per step, slower than the data plane), side
by side:

- do_get (before): the rank stream redeemed with a stock `do_get`, flow-controlled by gRPC in bytes;
- credits (now): the same ticket over `do_exchange`, the constructor sending a step only within the
  client's credit (`wire/credits.py`).

After every step the training loop takes, the rank's constructor is asked (its `status`) for the
last step it handed out; in flight = that step - the step just yielded. Measured, per rank: the
largest and the median over the run, and the bytes of one step's table. Then the cost of credits
when the data plane is the bottleneck: each mode once more on a fresh run with a training loop that
does nothing, steps per second over the run (rank 0's wall time from its first step to its last).

    .venv/bin/python -m benchmarks.delivery.inflight  # 80 steps, prefetch 2, 20 ms per step
    .venv/bin/python -m benchmarks.delivery.inflight --steps 200 --prefetch 4 --data data/demo
"""
from __future__ import annotations

import statistics
import threading
import time

from benchmarks.common.benchlib import add_corpus_args, argument_parser, log, print_header, workspace, write_config
from flight_overlord import harness
from flight_overlord.client import StepFetcher
from flight_overlord.deploy.launch import LocalCluster

SOURCES = ["captions", "code", "docstrings", "qa"]




def rate(config, args, *, credits: bool) -> float:
    """Steps per second a rank gets with a training loop that does nothing (rank 0, first to last step)."""
    seen: list[float] = []

    def on_table(rank, client, table):
        if rank == 0:
            seen.append(time.monotonic())
        return None
    with LocalCluster(config) as cluster, (_no_change() if credits else _stock_rank_streams()):
        harness.train(cluster.planner, args.ranks, 0, args.steps, on_table=on_table, prefetch=args.prefetch)
    return (len(seen) - 1) / (seen[-1] - seen[0])


class _no_change:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def measure(config, args, *, credits: bool) -> tuple[dict[int, list[int]], int]:
    """Per rank, steps in flight after each step yielded; the bytes of a step's table (rank 0's last)."""
    in_flight: dict[int, list[int]] = {r: [] for r in range(args.ranks)}
    nbytes = [0]
    lock = threading.Lock()

    def on_table(rank, client, table):
        step = table.column("step")[0].as_py()
        with lock:
            in_flight[rank].append(harness.served_step(cluster, rank) - step)
            nbytes[0] = table.nbytes
        time.sleep(args.step_ms / 1e3)
        return step

    with LocalCluster(config) as cluster:
        if credits:
            harness.train(cluster.planner, args.ranks, 0, args.steps, on_table=on_table, prefetch=args.prefetch)
        else:
            with _stock_rank_streams():
                harness.train(cluster.planner, args.ranks, 0, args.steps, on_table=on_table, prefetch=args.prefetch)
    return in_flight, nbytes[0]


class _stock_rank_streams:
    """TrainerClients whose rank streams are a stock do_get (no credit): how they read before."""

    def __enter__(self):
        from flight_overlord.client import trainer
        self._module, self._original = trainer, trainer.StepFetcher

        class StockStream(StepFetcher):
            def __init__(self, *a, **options):
                super().__init__(*a, **{**options, "window": None})
        trainer.StepFetcher = StockStream

    def __exit__(self, *exc):
        self._module.StepFetcher = self._original


def main() -> None:
    p = argument_parser(__doc__)
    add_corpus_args(p, scale=0.05)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--step-ms", type=float, default=20.0, help="the training loop's time per step")
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args()
    print_header()
    with workspace("bench_inflight-", args.data, SOURCES, args.scale) as (tmp, data_dir):
        rows = []
        for name, credits in (("do_get (before)", False), ("credits (now)", True)):
            config = write_config(tmp / f"{credits}.yaml", data_dir, [{"name": n} for n in SOURCES], ranks=args.ranks,
                                  context_length=1024, microbatches=2, tokens_per_step=1800 * args.ranks, seed=0,
                                  run_dir=tmp / f"run-{credits}", prefetch=args.prefetch)
            log(f"{name}: {args.steps} steps, {args.ranks} ranks, prefetch {args.prefetch}, {args.step_ms:g} ms a step")
            in_flight, nbytes = measure(config, args, credits=credits)
            config = write_config(tmp / f"rate-{credits}.yaml", data_dir, [{"name": n} for n in SOURCES],
                                  ranks=args.ranks, context_length=1024, microbatches=2,
                                  tokens_per_step=1800 * args.ranks, seed=0, run_dir=tmp / f"rate-{credits}",
                                  prefetch=args.prefetch)
            rows.append((name, in_flight, nbytes, rate(config, args, credits=credits)))
        print(f"\nsteps in flight per rank (sent by its constructor, not yet yielded), prefetch {args.prefetch}, "
              f"bound prefetch + 1 = {args.prefetch + 1}, {args.steps} steps at {args.step_ms:g} ms:")
        print("\n| rank stream | rank | max in flight | median | bytes of a step |")
        print("|---|---:|---:|---:|---:|")
        for name, in_flight, nbytes, _ in rows:
            for rank, counts in in_flight.items():
                print(f"| {name} | {rank} | {max(counts)} | {statistics.median(counts):g} | {nbytes:,} |")
        print("\nwith a training loop that does nothing (the data plane is the bottleneck):\n")
        print("| rank stream | steps/s (rank 0) |")
        print("|---|---:|")
        for name, _, _, steps_per_second in rows:
            print(f"| {name} | {steps_per_second:.1f} |")


if __name__ == "__main__":
    main()
