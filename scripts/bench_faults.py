#!/usr/bin/env python
"""Fault tolerance: what a kill -9 of each role costs the trainers, what a full-cluster resume costs,
and what shadow loaders and checkpointing cost.

Three parts, on one demo corpus (``make_demo_data(seed=0, scale=--scale)``), every role a process of
a supervised ``LocalCluster`` on this machine:

1. kill -9 per role  for each failure kind (a loader without a shadow, a loader with one shadow,
                     the Planner, a constructor) and each --prefetch value: one run of --steps steps
                     on --ranks trainer ranks (a thread each, ``TrainerClient``, prefetch = the config's
                     ``prefetch``) that consume every step at a steady simulated step time
                     (--step-time, 50 ms: the trainer sleeps so that each step takes that long after
                     its batch arrived, which gives prefetch something to hide the fault behind).
                     When rank 0 reaches step --kill-every, 2x, ... the role gets SIGKILL (the next
                     kill waits until the role serves again). Per fault:
                     - stall: the longest interval between a rank's consecutive batches (as the
                       trainer sees them, step time included) among those ending between this kill
                       and the next, against the median interval of the run (~ the step time);
                     - recovery: kill -> the supervisor restarted it (``Child.restarts``) -> its ready
                       file (mtime) -> the first ``status`` call that succeeds on a fresh connection;
                     - steps lost: every rank's stream (sample keys per microbatch and a hash of the
                       token ids, per step) against an undisturbed run of the same config; must be 0.
                     The loader kills hit ``loader-<--loader-source>-0`` (part 1 runs ``loader.hosts:
                     0``, one process per loader actor); constructor kills alternate
                     between the constructors.
2. resume            one run driven as fast as it goes (a ``StepFetcher`` thread per rank, a tiny
                     config: 1 microbatch of 512 tokens per rank) to step N for each --resume-at N;
                     there the whole cluster gets SIGKILL at once and restarts with
                     ``mode="resume"`` (--resume-reps times): time from ``LocalCluster(...)`` to
                     ``start()`` returning (start-up: processes, imports, registration) and to the
                     first batch of step N on every rank (``TrainerClient.load_state_dict``). The
                     state restore itself (latest snapshot + journal tail, the Planner's and every
                     loader's) is also timed in this process, from the files, between kill and
                     resume. The drive is unsupervised (a full-cluster kill must not be restarted).
3. costs             shadows: PSS (psutil ``memory_full_info().pss``, max over samples every 1 s) and
                     CPU time of the loader processes in the undisturbed runs of part 1 with
                     ``loader.shadows`` 0 and 1 (same steps). Checkpointing: bytes in run_dir after
                     those runs (and after part 2's run), split into the plan journal, Planner
                     snapshots, loader journals and loader snapshots (nothing is ever rewritten or
                     pruned, so file sizes are bytes written), per step.

    .venv/bin/python scripts/bench_faults.py                     # defaults: ~3-4 min on 2 cores
    .venv/bin/python scripts/bench_faults.py --parts 1 --kinds planner --prefetch 2 4 8
    .venv/bin/python scripts/bench_faults.py --parts 2 --resume-at 50 500 5000 20000

Timings are wall-clock on a possibly shared machine: the header gives the load average; no timing
is asserted. Steps lost are checked and any mismatch is printed.
"""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.flight as fl

from benchlib import (MiB, PssSampler, argument_parser, add_corpus_args, log, print_header, tree_usage, workspace,
                      write_config)
from flight_overlord import wire
from flight_overlord.client import TrainerClient
from flight_overlord.config import load_config
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.harness import each_rank, fetch_steps, step_digest
from flight_overlord.loader.state import LoaderState
from flight_overlord.planner.planner import Planner
from flight_overlord.planner.strategy import load_strategy
from flight_overlord.journal import Snapshots, read_journal

SOURCES = {"captions": 0.15, "longdocs": 0.25, "code": 0.20, "docstrings": 0.15, "manuals": 0.15, "qa": 0.10}
KINDS = ("loader", "loader+shadow", "planner", "planner+standby", "constructor")
SEED = 7
STALL_GOAL = 2.0  # a fault with a hot standby (a shadow) or prefetch to hide behind should stay under this x median


def fmt_s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def med(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# ---------------------------------------------------------------------------------------------
# Part 1: kill -9 of one role every --kill-every steps, trainers at a steady step time
# ---------------------------------------------------------------------------------------------

@dataclass
class Fault:
    role: str
    step: int            # rank 0's last consumed step when the kill was sent
    t_kill: float
    t_restart: float | None = None   # the supervisor spawned the new process
    t_ready: float | None = None     # its ready file (mtime)
    t_serving: float | None = None   # first successful status call on a fresh connection
    max_interval: float = 0.0        # longest trainer interval ending in this fault's window
    max_wait: float = 0.0            # longest time a trainer blocked on next() in the window

    @property
    def recovery(self) -> float | None:
        return None if self.t_serving is None else self.t_serving - self.t_kill


@dataclass
class Run:
    name: str
    steps: int
    startup: float = 0.0
    streams: dict[int, list] = field(default_factory=dict)     # rank -> [(step, digest)]
    arrivals: dict[int, list] = field(default_factory=dict)    # rank -> [(step, time.time(), wait)]
    faults: list[Fault] = field(default_factory=list)
    error: str | None = None
    loaders: dict | None = None   # part 3: PSS/CPU of the loader processes
    run_dir_bytes: dict | None = None

    def intervals(self) -> list[tuple[float, float, float]]:
        """(end time, interval, wait) for every pair of consecutive batches of every rank."""
        out = []
        for arrivals in self.arrivals.values():
            for (_, t0, _), (_, t1, wait) in zip(arrivals, arrivals[1:]):
                out.append((t1, t1 - t0, wait))
        return out

    def median_interval(self) -> float:
        return statistics.median(i for _, i, _ in self.intervals())

    def max_interval(self) -> float:
        return max(i for _, i, _ in self.intervals())


def part1_config(tmp: Path, data_dir: Path, name: str, args, *, prefetch: int, shadows: int,
                 standbys: int = 0) -> Path:
    directory = tmp / "part1" / name
    directory.mkdir(parents=True)
    return write_config(directory / "config.yaml", data_dir, [{"name": n, "weight": w} for n, w in SOURCES.items()],
                        ranks=args.ranks, context_length=1024, microbatches=2, tokens_per_step=1800 * args.ranks,
                        seed=SEED, run_dir=directory / "run", balance={"method": "greedy"}, prefetch=prefetch,
                        checkpoint={"every": args.checkpoint_every}, planner={"standbys": standbys},
                        loader={"shadows": shadows, "hosts": 0})  # one process per actor: a kill hits one source


def kill_targets(args) -> list[int]:
    return list(range(args.kill_every, args.steps - args.kill_every + 1, args.kill_every))


def run_part1(config: Path, name: str, args, *, prefetch: int, kind: str | None = None,
              measure_loaders: bool = False) -> Run:
    """One supervised run of ``args.steps`` steps; ``kind``: the role kind to kill every ``args.kill_every`` steps."""
    run = Run(name, args.steps)
    cfg = load_config(config)
    started = time.perf_counter()
    cluster = LocalCluster(config, mode="new", supervise=True)
    cluster.start()
    run.startup = time.perf_counter() - started
    progress = {r: -1 for r in range(args.ranks)}
    cond = threading.Condition()
    done = threading.Event()
    errors: list[str] = []
    try:
        sampler = None
        if measure_loaders:
            def roots():
                return [(c.process.pid, "shadow" if "-shadow" in c.name else "loader", "child")
                        for c in cluster.children if c.name.startswith("loader-")]
            sampler = PssSampler(roots).start()

        def rank_loop(rank: int) -> None:
            run.streams[rank], run.arrivals[rank] = [], []
            try:
                with TrainerClient(cluster.planner, rank, num_steps=args.steps, prefetch=prefetch,
                                   as_tensors=False, timeout=120) as client:
                    client.load_state_dict({"rank": rank, "next_step": 0})
                    batches = iter(client)
                    while True:
                        asked = time.time()
                        try:
                            table = next(batches)
                        except StopIteration:
                            break
                        arrived = time.time()
                        step = table.column("step")[0].as_py()
                        run.arrivals[rank].append((step, arrived, arrived - asked))
                        run.streams[rank].append((step, step_digest(table)))
                        with cond:
                            progress[rank] = step
                            cond.notify_all()
                        time.sleep(max(0.0, arrived + args.step_time - time.time()))  # the simulated step
            except BaseException as exc:  # noqa: BLE001 - reported with the run
                errors.append(f"rank {rank}: {type(exc).__name__}: {exc}")
            finally:
                with cond:
                    progress[rank] = max(progress[rank], args.steps)  # let the killer finish
                    cond.notify_all()

        def killer() -> None:
            for i, target in enumerate(kill_targets(args)):
                with cond:
                    cond.wait_for(lambda: progress[0] >= target or done.is_set())
                    step = progress[0]
                if done.is_set() or step >= args.steps:
                    return
                role = role_to_kill(kind, i, cfg, args)
                child = cluster.child(role)
                before = len(child.restarts)
                fault = Fault(role, step, time.time())
                cluster.kill(role)
                run.faults.append(fault)
                watch_recovery(cluster, child, before, fault, done)

        threads = [threading.Thread(target=rank_loop, args=(r,), daemon=True) for r in range(args.ranks)]
        if kind is not None:
            threads.append(threading.Thread(target=killer, daemon=True))
        for t in threads:
            t.start()
        for t in threads[:args.ranks]:
            t.join(timeout=600)
        done.set()
        with cond:
            cond.notify_all()
        for t in threads[args.ranks:]:
            t.join(timeout=130)
        if sampler is not None:
            sampler.stop()
            final = tree_usage(sampler.roots())
            seconds = sampler._window[1] - sampler._window[0]
            run.loaders = {
                "by_label": {label: (n, pss) for label, (n, pss) in sampler.pss_by_label.items()},
                "max_pss": sampler.max_pss, "processes": sampler.processes,
                "cpu_window": dict(sampler.cpu_by_label), "window": seconds,
                "cpu_total": {label: sum(c for l2, _, c in final.values() if l2 == label)
                              for label in {l2 for l2, _, _ in final.values()}},
            }
    finally:
        done.set()
        cluster.stop()
    run.error = "; ".join(errors) or None
    run.run_dir_bytes = run_dir_bytes(cfg.run_dir)
    assign_windows(run)
    return run


def role_to_kill(kind: str, i: int, cfg, args) -> str:
    if kind in ("loader", "loader+shadow"):
        return f"loader-{args.loader_source}-0"
    if kind in ("planner", "planner+standby"):
        return "planner"
    if kind == "constructor":
        return f"constructor-{i % cfg.num_constructors}"
    raise ValueError(kind)


def watch_recovery(cluster: LocalCluster, child, before: int, fault: Fault, done: threading.Event,
                   timeout: float = 120.0) -> None:
    """Fill in when the killed role was restarted, wrote its ready file, and answered a status call."""
    deadline = time.monotonic() + timeout
    while len(child.restarts) <= before:
        if time.monotonic() > deadline:
            return
        time.sleep(0.005)
    fault.t_restart = child.restarts[before]
    while not child.ready_file.exists():  # _spawn removed the old one before it restarted the process
        if time.monotonic() > deadline:
            return
        time.sleep(0.005)
    try:
        fault.t_ready = child.ready_file.stat().st_mtime
    except FileNotFoundError:
        fault.t_ready = time.time()
    while time.monotonic() < deadline:
        client = fl.connect(child.location)  # a fresh channel: no reconnect back-off of an old one
        try:
            wire.call(client, "status", timeout=5)
            fault.t_serving = time.time()
            return
        except fl.FlightError:  # not up yet (unavailable), or up but not ready to answer
            time.sleep(0.005)
        finally:
            client.close()


def assign_windows(run: Run) -> None:
    """Each fault's window: from its kill to the next kill (or the end of the run)."""
    intervals = run.intervals()
    for i, fault in enumerate(run.faults):
        end = run.faults[i + 1].t_kill if i + 1 < len(run.faults) else float("inf")
        inside = [(iv, w) for t, iv, w in intervals if fault.t_kill <= t < end]
        if inside:
            fault.max_interval = max(iv for iv, _ in inside)
            fault.max_wait = max(w for _, w in inside)


def compare(run: Run, reference: Run) -> tuple[int, list[str]]:
    """(steps lost, what differed): every (rank, step) whose batch is missing, repeated or different."""
    lost, notes = 0, []
    for rank, ref in reference.streams.items():
        got = run.streams.get(rank, [])
        seen: dict[int, tuple] = {}
        for step, d in got:
            if step in seen:
                lost += 1
                notes.append(f"rank {rank} step {step}: delivered twice")
            seen[step] = d
        for step, d in ref:
            if step not in seen:
                lost += 1
                notes.append(f"rank {rank} step {step}: missing")
            elif seen[step] != d:
                lost += 1
                notes.append(f"rank {rank} step {step}: keys {seen[step][0]} hash {seen[step][1]} != undisturbed "
                             f"keys {d[0]} hash {d[1]}")
    return lost, notes


def part1(tmp: Path, data_dir: Path, args) -> tuple[dict, dict]:
    """Returns (undisturbed runs by (prefetch, shadows), fault runs by (kind, prefetch))."""
    references: dict[tuple[int, int], Run] = {}
    faults: dict[tuple[str, int], Run] = {}
    shadow_counts = sorted({1 if k == "loader+shadow" else 0 for k in args.kinds} | ({0, 1} if 3 in args.parts else set()))
    for prefetch in args.prefetch if 1 in args.parts else args.prefetch[:1]:
        for shadows in shadow_counts:
            name = f"undisturbed-p{prefetch}-s{shadows}"
            config = part1_config(tmp, data_dir, name, args, prefetch=prefetch, shadows=shadows)
            log(f"[part 1] {name}")
            references[(prefetch, shadows)] = run_part1(config, name, args, prefetch=prefetch,
                                                        measure_loaders=prefetch == args.prefetch[0])
        if 1 not in args.parts:
            continue
        for kind in args.kinds:
            shadows = 1 if kind == "loader+shadow" else 0
            name = f"{kind.replace('+', '-')}-p{prefetch}"
            config = part1_config(tmp, data_dir, name, args, prefetch=prefetch, shadows=shadows,
                                  standbys=int(kind == "planner+standby"))
            log(f"[part 1] kill -9 {kind}, prefetch {prefetch}")
            faults[(kind, prefetch)] = run_part1(config, name, args, prefetch=prefetch, kind=kind)
    return references, faults


def report_part1(references: dict, faults: dict, args) -> None:
    print("\n## Part 1: kill -9 of one role every "
          f"{args.kill_every} steps ({args.steps} steps, {args.ranks} ranks)\n")
    print(f"Trainers consume every step at a steady simulated step time of {args.step_time * 1000:.0f} ms "
          f"(they sleep after each batch), so prefetch can hide a fault. Config: 6 demo sources, one loader "
          f"each, one process per loader actor (loader.hosts: 0); dp {args.ranks}, 2 microbatches of 1,024 tokens per rank, {1800 * args.ranks} tokens per step; "
          f"checkpoint.every {args.checkpoint_every}; TrainerClient prefetch = config prefetch. Loader kills hit "
          f"loader-{args.loader_source}-0; constructor kills alternate constructor-0/1. A kill waits until the "
          "previous one's role serves again.\n")
    print("stall = the longest interval between a rank's consecutive batches among those ending between a kill and "
          "the next, / the run's median interval. recovery = kill -> the role answers a status call "
          f"(supervisor restart, ready file, first call). goal: stall < {STALL_GOAL:g}x for a loader with a shadow "
          "and for the Planner with prefetch >= 2.\n")
    print("| failure | prefetch | kills at steps | median interval ms | worst stall ms (x median) | mean stall ms "
          "| max wait in next() ms | undisturbed max ms (x median) | recovery s mean / max | steps lost | goal |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    problems = []
    for (kind, prefetch), run in faults.items():
        shadows = 1 if kind == "loader+shadow" else 0
        ref = references[(prefetch, shadows)]
        median = run.median_interval() if run.intervals() else float("nan")
        worst = max((f.max_interval for f in run.faults), default=0.0)
        mean = statistics.mean(f.max_interval for f in run.faults) if run.faults else 0.0
        wait = max((f.max_wait for f in run.faults), default=0.0)
        recoveries = [f.recovery for f in run.faults if f.recovery is not None]
        lost, notes = compare(run, ref)
        ref_median = ref.median_interval()
        goal = "-"
        if kind in ("loader+shadow", "planner+standby") or (kind == "planner" and prefetch >= 2):
            goal = "met" if worst < STALL_GOAL * median else "MISSED"
            if goal == "MISSED":
                problems.append(f"{kind}, prefetch {prefetch}: worst stall {worst * 1000:.0f} ms = "
                                f"{worst / median:.1f}x the median {median * 1000:.0f} ms")
        print(f"| {kind} | {prefetch} | {', '.join(str(f.step) for f in run.faults)} | {median * 1000:.0f} "
              f"| {worst * 1000:.0f} ({worst / median:.1f}x) | {mean * 1000:.0f} | {wait * 1000:.0f} "
              f"| {ref.max_interval() * 1000:.0f} ({ref.max_interval() / ref_median:.1f}x) "
              f"| {fmt_s(statistics.mean(recoveries) if recoveries else None)} / "
              f"{fmt_s(max(recoveries) if recoveries else None)} | {lost} | {goal} |")
        if run.error:
            problems.append(f"{kind}, prefetch {prefetch}: trainer error: {run.error}")
        if lost:
            problems.append(f"{kind}, prefetch {prefetch}: {lost} steps lost:\n    " + "\n    ".join(notes[:20]))
        if len(run.faults) != len(kill_targets(args)) or any(f.t_serving is None for f in run.faults):
            problems.append(f"{kind}, prefetch {prefetch}: {len(run.faults)} kills, "
                            f"{sum(f.t_serving is not None for f in run.faults)} recovered")

    print("\nEvery fault (times in seconds after the kill; stall = longest trainer interval in its window):\n")
    print("| failure | prefetch | role | at step | restarted | ready file | serving | stall ms | x median |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (kind, prefetch), run in faults.items():
        median = run.median_interval() if run.intervals() else float("nan")
        for f in run.faults:
            rel = [None if t is None else t - f.t_kill for t in (f.t_restart, f.t_ready, f.t_serving)]
            print(f"| {kind} | {prefetch} | {f.role} | {f.step} | {fmt_s(rel[0])} | {fmt_s(rel[1])} | {fmt_s(rel[2])} "
                  f"| {f.max_interval * 1000:.0f} | {f.max_interval / median:.1f} |")

    streams = {k: r.streams for k, r in references.items()}
    first = next(iter(streams.values()))
    same = all(s == first for s in streams.values())
    print(f"\n- undisturbed runs ({', '.join(f'prefetch {p} shadows {s}' for p, s in streams)}): "
          f"{'identical streams on every rank' if same else 'STREAMS DIFFER'}; start-up "
          + ", ".join(f"{r.startup:.1f}s" for r in references.values()))
    for run in list(references.values()) + list(faults.values()):
        if run.error and run not in faults.values():
            problems.append(f"{run.name}: {run.error}")
    if not same:
        problems.append("the undisturbed runs of different prefetch/shadow settings delivered different streams")
    print("- problems: " + ("none" if not problems else "\n  - " + "\n  - ".join(problems)))


# ---------------------------------------------------------------------------------------------
# Part 2: full-cluster kill at step N, then mode="resume": time to the first batch
# ---------------------------------------------------------------------------------------------

@dataclass
class Resume:
    step: int
    startup: float          # LocalCluster(...) -> start() returned
    planner_ready: float    # -> the Planner's ready file
    first_batch: float      # -> every rank has step N
    restore_ms: float | None  # in-process: Planner + loaders' state from snapshot + journal tail
    journal_bytes: int
    planner_snapshot: int
    loader_snapshots: int
    snapshot_files: tuple[int, int]  # (Planner, loaders): every snapshot ever taken stays on disk


def part2_config(tmp: Path, data_dir: Path, args) -> Path:
    directory = tmp / "part2"
    directory.mkdir(parents=True)
    return write_config(directory / "config.yaml", data_dir, [{"name": n, "weight": w} for n, w in SOURCES.items()],
                        ranks=args.ranks, context_length=512, microbatches=1, tokens_per_step=400 * args.ranks,
                        seed=SEED, run_dir=directory / "run", balance={"method": "greedy"}, prefetch=4,
                        checkpoint={"every": args.checkpoint_every})


def drive(planner: str, ranks: int, start: int, end: int) -> None:
    """Steps [start, end) on every rank, as fast as they come."""
    fetch_steps(planner, ranks, start, end, keep=False)


def kill_all(cluster: LocalCluster) -> None:
    for child in cluster.children:  # the whole cluster at once
        child.process.kill()
    for child in cluster.children:
        child.process.wait()
    cluster.stop()


def restore_ms(config: Path) -> float | None:
    """The state restore alone, in this process, read-only: the Planner's (latest snapshot + journal
    tail) and every loader actor's (``LoaderState`` from its snapshot + journal tail). None (and a
    note on stderr) if the package's internals this reads have changed."""
    try:
        return _restore_ms(config)
    except Exception as exc:  # noqa: BLE001 - an auxiliary figure; the resume timings stand without it
        log(f"[part 2] in-process restore not measured: {type(exc).__name__}: {exc}")
        return None


def _restore_ms(config: Path) -> float:
    cfg = load_config(config)
    strategy = load_strategy(cfg, cfg.mesh)
    started = time.perf_counter()
    planner = Planner(cfg, strategy, lambda s: None)
    planner.open(resume=True)
    planner.close()
    for source in cfg.sources:
        for actor in range(source.loaders):
            stem = f"{source.name}-{actor}"
            state, offset = LoaderState(), 0
            snapshot = Snapshots(cfg.run_dir / "loaders", stem).latest()
            if snapshot is not None:
                state.load_state_dict(snapshot[1]["state"])
                offset = snapshot[1]["journal_offset"]
            for _, record in read_journal(cfg.run_dir / "loaders" / f"{stem}.jsonl", offset):
                state.apply(record)
    return (time.perf_counter() - started) * 1000


def latest_size(directory: Path, name: str) -> int:
    steps = Snapshots(directory, name).steps()
    return (directory / f"{name}-{steps[-1]:09d}.json").stat().st_size if steps else 0


def resume_once(config: Path, step: int, ranks: int) -> tuple[LocalCluster, float, float, float]:
    """(the resumed cluster, start-up s, Planner ready s, first batch of ``step`` on every rank s)."""
    started = time.perf_counter()
    wall = time.time()
    cluster = LocalCluster(config, mode="resume", supervise=False)
    cluster.start()
    startup = time.perf_counter() - started
    planner_ready = cluster.child("planner").ready_file.stat().st_mtime - wall
    arrived: dict[int, float] = {}

    def first(rank):
        with TrainerClient(cluster.planner, rank, num_steps=1, prefetch=1, as_tensors=False, timeout=120) as c:
            c.load_state_dict({"rank": rank, "next_step": step})
            for table in c:
                assert table.column("step")[0].as_py() == step
                arrived[rank] = time.perf_counter() - started
    try:
        each_rank(first, ranks)
    except BaseException:
        cluster.stop()
        raise
    return cluster, startup, planner_ready, max(arrived.values())


def part2(tmp: Path, data_dir: Path, args) -> tuple[list[Resume], dict, float]:
    config = part2_config(tmp, data_dir, args)
    cfg = load_config(config)
    results = []
    cluster = LocalCluster(config, mode="new", supervise=False)
    cluster.start()
    position, driving = 0, 0.0
    try:
        for target in sorted(args.resume_at):
            log(f"[part 2] driving to step {target}")
            started = time.perf_counter()
            drive(cluster.planner, args.ranks, position, target)
            driving += time.perf_counter() - started
            for rep in range(args.resume_reps):
                kill_all(cluster)
                restore = restore_ms(config)
                journal = (cfg.run_dir / "plan-journal.jsonl").stat().st_size
                planner_snap = latest_size(cfg.run_dir / "planner", "planner")
                loader_snaps = sum(latest_size(cfg.run_dir / "loaders", f"{s.name}-{a}")
                                   for s in cfg.sources for a in range(s.loaders))
                log(f"[part 2] resume at step {target} ({rep + 1}/{args.resume_reps})")
                cluster, startup, planner_ready, first = resume_once(config, target, args.ranks)
                files = (len(Snapshots(cfg.run_dir / "planner", "planner").steps()),
                         len(list((cfg.run_dir / "loaders").glob("*.json"))))
                results.append(Resume(target, startup, planner_ready, first, restore, journal, planner_snap,
                                      loader_snaps, files))
            position = target + 1
    finally:
        cluster.stop()
    return results, run_dir_bytes(cfg.run_dir), driving / max(1, max(args.resume_at))


def report_part2(results: list[Resume], args, seconds_per_step: float) -> None:
    print("\n## Part 2: full-cluster kill -9 at step N, then LocalCluster(mode=\"resume\")\n")
    print(f"One run (6 demo sources, one loader each, dp {args.ranks}, 1 microbatch of 512 tokens per rank, "
          f"{400 * args.ranks} tokens per step, prefetch 4, checkpoint.every {args.checkpoint_every}) driven as fast "
          f"as it goes ({1 / seconds_per_step:.0f} steps/s) to each N; there every process gets SIGKILL at once and "
          f"the cluster restarts with mode=\"resume\", {args.resume_reps} times per N (the first batch of step N is "
          "fetched each time). Times from LocalCluster(...) on; median of the repetitions, each listed after it. "
          "restore = the Planner's and every loader's state restore (find the latest snapshot by listing its "
          "directory, read it, fold in the journal tail), timed in this process from the files between the kill and "
          "the resume. Planner ready = its ready file's mtime.\n")
    print("| N | plan journal MB | snapshot files (Planner, loaders) | latest Planner snapshot KB "
          "| latest loader snapshots KB (sum) | restore ms | start-up s | Planner ready s | first batch of step N s "
          "| first batch after start-up s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in sorted({r.step for r in results}):
        rs = [r for r in results if r.step == n]

        def cell(values, fmt):
            return f"{fmt(med(values))} ({' / '.join(fmt(v) for v in values)})" if len(values) > 1 else fmt(values[0])
        seconds = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        millis = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
        print(f"| {n:,} | {rs[-1].journal_bytes / 1e6:.2f} | {rs[-1].snapshot_files[0]}, {rs[-1].snapshot_files[1]} "
              f"| {rs[-1].planner_snapshot / 1e3:.1f} "
              f"| {rs[-1].loader_snapshots / 1e3:.1f} | {cell([r.restore_ms for r in rs], millis)} "
              f"| {cell([r.startup for r in rs], seconds)} | {cell([r.planner_ready for r in rs], seconds)} "
              f"| {cell([r.first_batch for r in rs], seconds)} "
              f"| {cell([r.first_batch - r.startup for r in rs], seconds)} |")


# ---------------------------------------------------------------------------------------------
# Part 3: the cost of shadows and of checkpointing
# ---------------------------------------------------------------------------------------------

def run_dir_bytes(run_dir: Path) -> dict:
    """Bytes of the checkpoint files in run_dir, by kind (logs and the registry excluded)."""
    out = {"plan journal": 0, "Planner snapshots": 0, "loader journals": 0, "loader snapshots": 0,
           "planner_snapshot_files": 0, "loader_snapshot_files": 0, "journaled_steps": 0}
    journal = run_dir / "plan-journal.jsonl"
    if journal.exists():
        out["plan journal"] = journal.stat().st_size
        out["journaled_steps"] = len({r["step"] for _, r in read_journal(journal) if "bins" in r})
    for path in (run_dir / "planner").glob("planner-*.json"):
        out["Planner snapshots"] += path.stat().st_size
        out["planner_snapshot_files"] += 1
    for path in (run_dir / "loaders").glob("*"):
        if path.suffix == ".jsonl":
            out["loader journals"] += path.stat().st_size
        elif path.suffix == ".json":
            out["loader snapshots"] += path.stat().st_size
            out["loader_snapshot_files"] += 1
    return out


def report_part3(references: dict, args, part2_bytes: dict | None) -> None:
    print("\n## Part 3: what shadows and checkpointing cost\n")
    prefetch = args.prefetch[0]
    runs = {s: references[(prefetch, s)] for s in (0, 1) if (prefetch, s) in references}
    print(f"Shadows: the loader processes of the undisturbed part-1 runs (prefetch {prefetch}, {args.steps} steps, "
          f"{args.ranks} ranks, {args.step_time * 1000:.0f} ms per step), PSS sampled every 1 s (max of the sum), "
          "CPU from psutil: while the trainers consumed, and in all (start-up included).\n")
    print("| loader.shadows | loader processes | PSS MiB (sum, at max) | per process MiB | CPU s while consuming "
          "| CPU s in all | CPU ms per step (in all) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = None
    for shadows, run in runs.items():
        info = run.loaders or {}
        n = info.get("processes", 0)
        pss = info.get("max_pss", 0) / MiB
        cpu_window = sum(info.get("cpu_window", {}).values())
        cpu_total = sum(info.get("cpu_total", {}).values())
        split = "; ".join(f"{label} {k}x {p / MiB:.0f}" for label, (k, p) in sorted(info.get("by_label", {}).items()))
        print(f"| {shadows} | {n} | {pss:.0f} ({split}) | {pss / max(1, n):.0f} | {cpu_window:.2f} | {cpu_total:.2f} "
              f"| {cpu_total / run.steps * 1000:.1f} |")
        if shadows == 0:
            base = (pss, cpu_window, cpu_total)
        elif base:
            print(f"\n- one shadow per loader: x{pss / base[0]:.2f} loader PSS, x{cpu_window / max(1e-9, base[1]):.2f} "
                  f"loader CPU while consuming, x{cpu_total / max(1e-9, base[2]):.2f} in all\n")
    print(f"Checkpointing (checkpoint.every {args.checkpoint_every}): bytes in run_dir after a run; nothing is "
          "rewritten or pruned, so these are the bytes written. Per step = / steps journaled by the Planner "
          "(it plans prefetch steps ahead of the trainers).\n")
    print("| run | steps journaled | plan journal | Planner snapshots | loader journals | loader snapshots "
          "| total | bytes per step |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = [(f"part 1, shadows {s}, {references[(prefetch, s)].steps} steps", references[(prefetch, s)].run_dir_bytes)
            for s in runs]
    if part2_bytes:
        rows.append((f"part 2 (tiny steps, to {max(args.resume_at):,}, {len(args.resume_at) * args.resume_reps} "
                     "resumes)", part2_bytes))
    for name, b in rows:
        steps = max(1, b["journaled_steps"])
        kinds = ("plan journal", "Planner snapshots", "loader journals", "loader snapshots")
        total = sum(b[k] for k in kinds)
        cells = [f"{b['plan journal'] / 1e3:,.1f} KB",
                 f"{b['Planner snapshots'] / 1e3:,.1f} KB ({b['planner_snapshot_files']} files)",
                 f"{b['loader journals'] / 1e3:,.1f} KB",
                 f"{b['loader snapshots'] / 1e3:,.1f} KB ({b['loader_snapshot_files']} files)"]
        print(f"| {name} | {b['journaled_steps']:,} | {' | '.join(cells)} | {total / 1e3:,.1f} KB "
              f"| {total / steps:,.0f} ({', '.join(f'{b[k] / steps:,.0f}' for k in kinds)}) |")


# ---------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argument_parser(__doc__)
    p.add_argument("--parts", type=int, nargs="+", default=[1, 2, 3], choices=[1, 2, 3])
    p.add_argument("--ranks", type=int, default=2, help="data-parallel trainer ranks (default 2)")
    p.add_argument("--steps", type=int, default=75, help="part 1: steps per run (default 75)")
    p.add_argument("--kill-every", type=int, default=15, help="part 1: kill -9 every this many steps (default 15)")
    p.add_argument("--step-time", type=float, default=0.05, help="part 1: simulated seconds per step (default 0.05)")
    p.add_argument("--prefetch", type=int, nargs="+", default=[2, 4], help="part 1: prefetch values (default 2 4)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS, help="part 1: failure kinds")
    p.add_argument("--loader-source", default="longdocs", choices=sorted(SOURCES), help="part 1: whose loader dies")
    p.add_argument("--checkpoint-every", type=int, default=25, help="checkpoint.every (default 25)")
    p.add_argument("--resume-at", type=int, nargs="+", default=[50, 500, 5000], help="part 2: N (default 50 500 5000)")
    p.add_argument("--resume-reps", type=int, default=3, help="part 2: resumes per N (default 3)")
    add_corpus_args(p, scale=0.3)
    args = p.parse_args(argv)
    if min(args.ranks, args.steps, args.kill_every, args.resume_reps, *args.prefetch, *args.resume_at) < 1:
        p.error("--ranks, --steps, --kill-every, --resume-reps, --prefetch and --resume-at must be >= 1")
    if 1 in args.parts and not kill_targets(args):
        p.error("--kill-every leaves no kill before the last --kill-every steps of --steps")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    print_header()
    with workspace("bench-faults-", args.data, list(SOURCES), args.scale) as (tmp, data_dir):
        references, faults, part2_results, part2_bytes = {}, {}, [], None
        if 1 in args.parts or 3 in args.parts:
            references, faults = part1(tmp, data_dir, args)
        if 2 in args.parts:
            part2_results, part2_bytes, seconds_per_step = part2(tmp, data_dir, args)
        if 1 in args.parts:
            report_part1(references, faults, args)
        if 2 in args.parts:
            report_part2(part2_results, args, seconds_per_step)
        if 3 in args.parts:
            report_part3(references, args, part2_bytes)


if __name__ == "__main__":
    main()
