"""Load: 64 concurrent trainer clients for a fixed time; fetch latency, steps/s, errors, exactly-once, PSS.

A dp=64 mesh over the six text sources of the demo corpus (``make_demo_data(seed=0, scale=--scale)``),
cheap steps (1 microbatch of 256 tokens per rank, ~70% full), ``constructor: {dp_per_constructor: 16}``
so 4 constructor processes serve the 64 ranks (plus 6 loaders and the Planner: 11 role processes).
One thread per rank in this process runs ``StepFetcher.fetch(step)`` (the Planner's ticket, then the
constructor's ``do_get``) step after step, as fast as the run allows: ranks drift apart by at most the
Planner's prefetch window, so a fetch includes waiting for the slowest rank.

- latency: per ``fetch`` of one rank's step, p50 / p99 / max over the timed phase (after --warmup s).
- steps/s: global steps (every rank has it) completed in the timed phase, per second; and fetches/s.
- errors: any exception a fetch raises (StepFetcher already retries time-outs and unreachable roles).
- exactly-once: after the timed phase every rank catches up to the furthest step any rank reached;
  then, for every step, the multiset of sample keys delivered to all ranks equals the keys the
  Planner's journal planned for it (a key comes again only in a later epoch, as the journal says).
- PSS: psutil ``memory_full_info().pss`` summed over the role processes (``cluster.children``), right
  after the warm-up and at the end; goal: within 10%. Also sampled every second (max, CPU by role).

    .venv/bin/python -m benchmarks.control_plane.load               # 120 s timed, ~2.5 min in all
    .venv/bin/python -m benchmarks.control_plane.load --seconds 20  # a quick look

tests/integration/test_load.py runs the same (``run_load``) for ~15 s in the default suite and for
120 s under ``-m slow``.
"""
from __future__ import annotations

import collections
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import psutil

from benchmarks.common.benchlib import MiB, add_corpus_args, argument_parser, log, print_header, workspace, write_config
from flight_overlord.client import StepFetcher
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.harness import RankThreads

SOURCES = {"captions": 0.15, "longdocs": 0.25, "code": 0.20, "docstrings": 0.15, "manuals": 0.15, "qa": 0.10}
CONFIG = {  # the load config's sections beyond sources, data_root and run_dir
    "mesh": {"dp": 64},
    "constructor": {"dp_per_constructor": 16},
    "global_batch": {"context_length": 256, "microbatches": 1, "tokens_per_step": 11_500},
    "balance": {"method": "greedy"},
    "prefetch": 2,
}


def role_pss(cluster: LocalCluster) -> dict[str, int]:
    """PSS bytes of every role process, by child name."""
    out = {}
    for child in cluster.children:
        try:
            out[child.name] = psutil.Process(child.process.pid).memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            out[child.name] = 0
    return out


def role_cpu(cluster: LocalCluster) -> dict[str, float]:
    out = {}
    for child in cluster.children:
        try:
            t = psutil.Process(child.process.pid).cpu_times()
            out[child.name] = t.user + t.system
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            out[child.name] = 0.0
    return out


def kind(name: str) -> str:
    return name.split("-")[0]


@dataclass
class LoadResult:
    ranks: int
    seconds: float                      # the timed phase, as measured
    warmup: float
    latencies: np.ndarray               # seconds per fetch in the timed phase
    global_steps: int                   # steps every rank completed during the timed phase
    fetches: int                        # rank-steps fetched during the timed phase
    steps_checked: int                  # steps 0 .. steps_checked-1 compared with the journal
    errors: list[str]
    duplicates: int                     # delivered more often than planned (per step)
    missing: int                        # planned but not delivered (per step)
    pss_warm: dict[str, int]
    pss_end: dict[str, int]
    pss_max: int
    cpu: dict[str, float]               # CPU seconds per role kind during the timed phase
    restarts: list[str] = field(default_factory=list)
    client_rss: int = 0

    @property
    def steps_per_s(self) -> float:
        return self.global_steps / self.seconds

    @property
    def pss_growth(self) -> float:
        return sum(self.pss_end.values()) / sum(self.pss_warm.values()) - 1

    @property
    def exactly_once(self) -> bool:
        return self.duplicates == 0 and self.missing == 0 and self.steps_checked > 0

    def lines(self) -> list[str]:
        p50, p99, worst = (np.percentile(self.latencies, q) * 1e3 for q in (50, 99, 100)) if len(self.latencies) \
            else (float("nan"),) * 3
        warm, end = sum(self.pss_warm.values()), sum(self.pss_end.values())
        by_kind_end = collections.Counter()
        for name, pss in self.pss_end.items():
            by_kind_end[kind(name)] += pss
        return [
            f"{self.ranks} trainer clients (threads), {self.seconds:.1f} s timed after {self.warmup:.0f} s warm-up",
            f"per-step fetch latency: p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {worst:.1f} ms "
            f"({len(self.latencies):,} fetches)",
            f"throughput: {self.steps_per_s:.2f} steps/s (every rank), {self.fetches / self.seconds:.1f} fetches/s",
            f"errors: {len(self.errors)}" + (f" (first: {self.errors[0]})" if self.errors else ""),
            f"exactly-once over steps 0..{self.steps_checked - 1}: "
            + ("yes" if self.exactly_once else f"NO ({self.duplicates} extra, {self.missing} missing)"),
            f"role PSS: {warm / MiB:.0f} MiB after warm-up, {end / MiB:.0f} MiB at the end "
            f"({100 * self.pss_growth:+.1f}%), max {self.pss_max / MiB:.0f} MiB; at the end by role: "
            + ", ".join(f"{k} {sum(1 for n in self.pss_end if kind(n) == k)}x {v / MiB:.0f}"
                        for k, v in by_kind_end.items()),
            "CPU in cores while timed: " + ", ".join(f"{k} {v / self.seconds:.2f}" for k, v in self.cpu.items())
            + f"; total {sum(self.cpu.values()) / self.seconds:.2f}",
            f"restarts: {', '.join(self.restarts) or 'none'}; this client process: RSS {self.client_rss / MiB:.0f} MiB",
        ]


def run_load(cluster: LocalCluster, journal_plans, *, seconds: float, warmup: float, timeout: float = 120.0,
             log=lambda message: None) -> LoadResult:
    """Drive a started ``cluster`` with one fetching thread per rank for ``warmup`` + ``seconds``;
    ``journal_plans()`` reads the Planner's journal (the plan records, by step) at the end."""
    ranks = cluster.cfg.mesh.world_size
    delivered: list[dict[int, list[str]]] = [dict() for _ in range(ranks)]  # rank -> step -> keys
    latencies: list[list[tuple[float, float]]] = [[] for _ in range(ranks)]  # (end time, seconds)
    done = [0] * ranks                   # steps fetched per rank
    stop = threading.Event()
    fetchers = [StepFetcher(cluster.planner, r, timeout=timeout) for r in range(ranks)]

    def fetch(rank: int, step: int) -> None:
        started = time.perf_counter()
        table = fetchers[rank].fetch(step)
        ended = time.perf_counter()
        latencies[rank].append((ended, ended - started))
        delivered[rank][step] = [k for keys in table.column("sample_keys").to_pylist() for k in keys]
        done[rank] = step + 1

    def trainer(rank: int) -> None:
        while not stop.is_set():
            fetch(rank, done[rank])

    pss_max, samples_stop = [0], threading.Event()

    def sample_pss() -> None:
        while not samples_stop.wait(1.0):
            pss_max[0] = max(pss_max[0], sum(role_pss(cluster).values()))

    sampler = threading.Thread(target=sample_pss, name="pss", daemon=True)
    started = time.perf_counter()
    trainers = RankThreads(trainer, ranks)
    errors = trainers.errors  # counted and reported
    sampler.start()
    time.sleep(warmup)
    pss_warm, cpu_warm, t0, done_warm = role_pss(cluster), role_cpu(cluster), time.perf_counter(), list(done)
    log(f"warm-up over: {min(done_warm)} steps; PSS {sum(pss_warm.values()) / MiB:.0f} MiB")
    next_note = t0 + 10
    while time.perf_counter() < t0 + seconds and not errors:
        time.sleep(0.2)
        if time.perf_counter() >= next_note:
            next_note += 10
            log(f"{time.perf_counter() - t0:.0f} s: {min(done)} steps, "
                f"PSS {sum(role_pss(cluster).values()) / MiB:.0f} MiB")
    t1, done_end, cpu_end = time.perf_counter(), list(done), role_cpu(cluster)
    pss_end = role_pss(cluster)
    stop.set()
    trainers.join(timeout + 10, raise_error=False)
    samples_stop.set()
    sampler.join()
    # catch up: every rank fetches up to the furthest step any rank reached
    last = max(done)
    for rank in range(ranks):
        try:
            while done[rank] < last and not any(e.startswith(f"rank {rank}:") for e in errors):
                fetch(rank, done[rank])
        except Exception as exc:  # noqa: BLE001
            errors.append(f"rank {rank}: step {done[rank]} (catching up): {type(exc).__name__}: {exc}")
    for f in fetchers:
        f.close()

    plans = journal_plans()
    checked = min(done)
    duplicates = missing = 0
    for step in range(checked):
        got = collections.Counter(k for r in range(ranks) for k in delivered[r][step])
        want = collections.Counter(k for b in plans[step]["bins"] for k in b)
        duplicates += sum((got - want).values())
        missing += sum((want - got).values())
    cpu = collections.Counter()
    for name in cpu_end:
        cpu[kind(name)] += cpu_end[name] - cpu_warm.get(name, 0.0)
    timed = [s for rank in latencies for end, s in rank if t0 <= end <= t1]
    return LoadResult(
        ranks=ranks, seconds=t1 - t0, warmup=t0 - started, latencies=np.array(timed),
        global_steps=min(done_end) - min(done_warm), fetches=sum(done_end) - sum(done_warm),
        steps_checked=checked, errors=errors, duplicates=duplicates, missing=missing,
        pss_warm=pss_warm, pss_end=pss_end, pss_max=max(pss_max[0], sum(pss_end.values())), cpu=dict(cpu),
        restarts=[f"{c.name} x{len(c.restarts)}" for c in cluster.children if c.restarts],
        client_rss=psutil.Process().memory_info().rss)


def plan_records(config_path) -> list[dict]:
    """The plans of the run's journal, indexed by step (re-derived from the source files, each
    checked against its journaled digest; trainer reports and others left out)."""
    from flight_overlord.config import load_config
    from flight_overlord.planner.audit import plan_records as journaled_plans
    plans = {r["step"]: r for r in journaled_plans(load_config(config_path).run_dir, str(config_path))}
    return [plans[s] for s in range(len(plans))]


def main(argv=None) -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=120.0, help="timed phase (default 120)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before the timed phase (default 10)")
    parser.add_argument("--ranks", type=int, default=64, help="trainer clients = data-parallel ranks (default 64)")
    add_corpus_args(parser, scale=0.1)
    args = parser.parse_args(argv)
    print_header()
    sections = {**CONFIG, "mesh": {"dp": args.ranks}}
    with workspace("bench-load-", args.data, list(SOURCES), args.scale) as (tmp, data_dir):
        gb = sections["global_batch"]
        config = write_config(tmp / "load.yaml", data_dir, [{"name": n, "weight": w} for n, w in SOURCES.items()],
                              ranks=args.ranks, context_length=gb["context_length"], microbatches=gb["microbatches"],
                              tokens_per_step=gb["tokens_per_step"] * args.ranks // 64, seed=7, run_dir=tmp / "run",
                              **{k: v for k, v in sections.items() if k not in ("mesh", "global_batch")})
        started = time.monotonic()
        with LocalCluster(config) as cluster:
            log(f"cluster up in {time.monotonic() - started:.1f} s: {len(cluster.children)} role processes")
            result = run_load(cluster, lambda: plan_records(config), seconds=args.seconds, warmup=args.warmup, log=log)
        print(f"config: dp={args.ranks} (constructor.dp_per_constructor 16: {cluster.cfg.num_constructors} "
              f"constructors), 6 text sources x 1 loader, 1 microbatch of {gb['context_length']} tokens per rank, "
              f"{gb['tokens_per_step'] * args.ranks // 64:,} tokens per step, prefetch {CONFIG['prefetch']}; "
              f"corpus scale {args.scale}")
        for line in result.lines():
            print(f"- {line}")
        ok = not result.errors and result.exactly_once and not result.restarts
        print(f"- goals: 0 errors {'met' if not result.errors else 'MISSED'}; exactly-once "
              f"{'met' if result.exactly_once else 'MISSED'}; PSS within 10% "
              f"{'met' if abs(result.pss_growth) <= 0.10 else 'MISSED'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
