"""Control plane: the Planner's CPU per rank-step with 64 trainer clients, per-step tickets vs rank streams.

The load config of ``benchmarks/control_plane/load.py`` (dp 64, 4 constructors of 16 ranks, six text sources, one
256-token microbatch per rank and step, prefetch 2), run twice in this process, each on a fresh
cluster and run_dir, with one trainer thread per rank:

- ``per-step``: ``StepFetcher.fetch(step)`` step after step: a Planner ticket for each step (the
  one-step slice ``("rank", rank, step, step + 1)`` of the rank stream), then the constructor's ``do_get``.
- ``stream``: ``TrainerClient`` (one ``("rank", rank, first)`` ticket, one long-lived ``do_get``).

Over the timed phase: the Planner process's CPU seconds (user + system, psutil) divided by the
rank-steps delivered (tickets + planning + journal: everything the Planner does), the journal's
bytes per planned step, rank-steps per second, and the share of the constructors' plan requests whose
answer brought the next step's constructor plan too (so that no request was made for it). ``measure()`` is the
function other benchmarks call (for instance a scale harness).

    .venv/bin/python -m benchmarks.control_plane.tickets_vs_streams               # 2 x (10 s warm-up + 30 s timed)
    .venv/bin/python -m benchmarks.control_plane.tickets_vs_streams --seconds 10  # a quick look
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass

import psutil

from benchmarks.common.benchlib import (
    REPO,
    add_corpus_args,
    argument_parser,
    log,
    print_header,
    workspace,
    write_config,
)
from benchmarks.control_plane.load import CONFIG, SOURCES
from flight_overlord import wire
from flight_overlord.client import StepFetcher, TrainerClient
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.harness import RankThreads
from flight_overlord.journal import journal_size

PATHS = ("per-step", "stream")


@dataclass
class ControlPlane:
    path: str
    ranks: int
    seconds: float          # the timed phase, as measured
    rank_steps: int         # steps delivered to all ranks together in the timed phase
    planner_cpu: float      # Planner CPU seconds in the timed phase
    journal_bytes: int      # plan journal growth in the timed phase
    planned_steps: int      # steps the Planner planned in the timed phase
    errors: list[str]
    answers: dict[str, int]  # plans-stream answers in the timed phase, by the constructor plans they carried

    @property
    def us_per_rank_step(self) -> float:
        return 1e6 * self.planner_cpu / max(self.rank_steps, 1)

    @property
    def journal_bytes_per_step(self) -> float:
        return self.journal_bytes / max(self.planned_steps, 1)

    @property
    def two_plan_share(self) -> float:
        """The share of plan requests whose answer brought the next step's constructor plan too."""
        return self.answers.get("2", 0) / max(sum(self.answers.values()), 1)

    def line(self) -> str:
        return (f"| {self.path} | {self.ranks} | {self.us_per_rank_step:,.0f} | {self.journal_bytes_per_step:,.0f} | "
                f"{self.rank_steps / self.seconds:,.0f} | {self.planner_cpu / self.seconds:.2f} | "
                f"{self.two_plan_share:.0%} | {len(self.errors)} |")


HEADER = ("| path | ranks | Planner CPU per rank-step (us) | journal bytes per step | rank-steps/s "
          "| Planner cores | answers with the next step's plan | errors |\n|---|---|---|---|---|---|---|---|")


def _planner_cpu(cluster: LocalCluster) -> float:
    times = psutil.Process(cluster.child("planner").process.pid).cpu_times()
    return times.user + times.system


def _planner_status(cluster: LocalCluster) -> dict:
    client = wire.server.connect(cluster.planner, cluster.credentials)
    try:
        return wire.call(client, "status")
    finally:
        client.close()


def measure(cluster: LocalCluster, path: str, *, seconds: float, warmup: float, timeout: float = 120.0,
            log=lambda message: None) -> ControlPlane:
    """Drive a started ``cluster`` with one trainer thread per rank over ``path`` ("per-step" or
    "stream") for ``warmup`` + ``seconds``; the Planner's CPU and journal over the timed phase."""
    if path not in PATHS:
        raise ValueError(f"unknown path {path!r} (paths: {', '.join(PATHS)})")
    ranks = cluster.cfg.mesh.world_size
    done = [0] * ranks
    stop = threading.Event()

    def per_step(rank: int) -> None:
        fetcher = StepFetcher(cluster.planner, rank, timeout=timeout)
        try:
            while not stop.is_set():
                fetcher.fetch(done[rank])
                done[rank] += 1
        finally:
            fetcher.close()

    def stream(rank: int) -> None:
        with TrainerClient(cluster.planner, rank, as_tensors=False, timeout=timeout) as client:
            for _ in client:
                done[rank] += 1
                if stop.is_set():
                    return

    journal = cluster.cfg.run_dir / "plan-journal.jsonl"
    ranks_running = RankThreads(per_step if path == "per-step" else stream, ranks)
    errors = ranks_running.errors  # counted and reported
    time.sleep(warmup)
    t0, cpu0, steps0, bytes0, status0 = (time.perf_counter(), _planner_cpu(cluster), sum(done),
                                         journal_size(journal), _planner_status(cluster))
    log(f"{path}: warm-up over at {min(done)} steps")
    while time.perf_counter() < t0 + seconds and not errors:
        time.sleep(0.2)
    t1, cpu1, steps1, bytes1, status1 = (time.perf_counter(), _planner_cpu(cluster), sum(done),
                                         journal_size(journal), _planner_status(cluster))
    stop.set()
    ranks_running.join(timeout=10, raise_error=False)
    answers = {k: n - status0.get("plan_answers", {}).get(k, 0) for k, n in status1.get("plan_answers", {}).items()}
    return ControlPlane(path, ranks, t1 - t0, steps1 - steps0, cpu1 - cpu0, bytes1 - bytes0,
                        status1["planned"] - status0["planned"], errors, answers)


def profile_planner(prefix: str) -> None:
    """Role processes started from now on load ``benchmarks/profiling/sitecustomize.py``; the Planner's
    samples its own stacks into ``prefix.PID``."""
    here = str(REPO / "benchmarks" / "profiling")
    os.environ["PYTHONPATH"] = os.pathsep.join([here] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    os.environ["OVERLORD_BENCH_PROFILE"] = f"planner:{os.path.abspath(prefix)}"


def main(argv=None) -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=30.0, help="timed phase per path (default 30)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before each timed phase (default 10)")
    parser.add_argument("--ranks", type=int, default=64, help="trainer clients = data-parallel ranks (default 64)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--profile", metavar="PREFIX", help="sample the Planner's stacks (benchmarks/profiling): "
                        "PREFIX-PATH.PID gets its busiest functions and its threads' CPU")
    add_corpus_args(parser, scale=0.1)
    args = parser.parse_args(argv)
    print_header()
    gb = CONFIG["global_batch"]
    results = []
    with workspace("bench-control-", args.data, list(SOURCES), args.scale) as (tmp, data_dir):
        for path in args.paths.split(","):
            sources = [{"name": n, "weight": w} for n, w in SOURCES.items()]
            config = write_config(tmp / f"{path}.yaml", data_dir, sources,
                                  ranks=args.ranks, context_length=gb["context_length"],
                                  microbatches=gb["microbatches"],
                                  tokens_per_step=gb["tokens_per_step"] * args.ranks // 64,
                                  seed=7, run_dir=tmp / f"run-{path}",
                                  **{k: v for k, v in CONFIG.items() if k not in ("mesh", "global_batch")})
            if args.profile:
                profile_planner(f"{args.profile}-{path}")
            with LocalCluster(config) as cluster:
                results.append(measure(cluster, path, seconds=args.seconds, warmup=args.warmup, log=log))
        print(f"config: dp={args.ranks}, constructor.dp_per_constructor 16, 6 text sources x 1 loader, "
              f"1 microbatch of {gb['context_length']} tokens per rank, prefetch {CONFIG['prefetch']}; "
              f"{args.seconds:.0f} s timed per path after {args.warmup:.0f} s warm-up")
        print(HEADER)
        for result in results:
            print(result.line())
        if len(results) == 2 and results[1].rank_steps:
            print(f"stream / per-step Planner CPU per rank-step: "
                  f"{results[1].us_per_rank_step / results[0].us_per_rank_step:.3f}x")
        for result in results:
            for error in result.errors[:3]:
                print(f"- {result.path} error: {error}")
    sys.exit(1 if any(r.errors for r in results) else 0)


if __name__ == "__main__":
    main()
