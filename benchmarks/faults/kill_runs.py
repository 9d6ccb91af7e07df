"""``faults.kill_and_resume`` part 1: kill -9 of one role every --kill-every steps while the trainers run at a steady
step time; every rank's stream compared with an undisturbed run."""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.flight as fl

from benchmarks.common.benchlib import PssSampler, log, tree_usage, write_config
from flight_overlord import wire
from flight_overlord.client import TrainerClient
from flight_overlord.config import load_config
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.harness import step_digest
from flight_overlord.journal import journal_size, read_journal

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


def run_dir_bytes(run_dir: Path) -> dict:
    """Bytes of the checkpoint files in run_dir, by kind (logs and the registry excluded)."""
    out = {"plan journal": 0, "Planner snapshots": 0, "loader journals": 0, "loader snapshots": 0,
           "planner_snapshot_files": 0, "loader_snapshot_files": 0, "journaled_steps": 0}
    journal = run_dir / "plan-journal.jsonl"
    if journal.exists():
        out["plan journal"] = journal_size(journal)  # its archive too
        out["journaled_steps"] = len({r["step"] for _, r in read_journal(journal) if "digest" in r or "bins" in r})
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


def part1_config(tmp: Path, data_dir: Path, name: str, args, *, prefetch: int, shadows: int,
                 standbys: int = 0, **extra) -> Path:
    directory = tmp / "part1" / name
    directory.mkdir(parents=True)
    return write_config(directory / "config.yaml", data_dir, [{"name": n, "weight": w} for n, w in SOURCES.items()],
                        ranks=args.ranks, context_length=1024, microbatches=2, tokens_per_step=1800 * args.ranks,
                        seed=SEED, run_dir=directory / "run", balance={"method": "greedy"}, prefetch=prefetch,
                        checkpoint={"every": args.checkpoint_every}, planner={"standbys": standbys},
                        # one process per actor: a kill hits one source
                        loader={"shadows": shadows, "hosts": 0}, **extra)


def kill_targets(args) -> list[int]:
    if getattr(args, "at", None):  # benchmarks.faults.hangs: the steps named
        return list(args.at)
    return list(range(args.kill_every, args.steps - args.kill_every + 1, args.kill_every))


def run_part1(config: Path, name: str, args, *, prefetch: int, kind: str | None = None,
              measure_loaders: bool = False, strike=None) -> Run:
    """One supervised run of ``args.steps`` steps; ``kind``: the role kind to kill every ``args.kill_every`` steps.
    ``strike(cluster, role, fault, done)``: what befalls the role instead of kill -9 and the wait for its
    recovery (benchmarks.faults.hangs: SIGSTOP)."""
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
                run.faults.append(fault)
                if strike is not None:
                    strike(cluster, role, fault, done)
                    continue
                cluster.kill(role)
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
    shadow_counts = sorted({1 if k == "loader+shadow" else 0 for k in args.kinds}
                           | ({0, 1} if 3 in args.parts else set()))
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
          f"each, one process per loader actor (loader.hosts: 0); dp {args.ranks}, 2 microbatches of 1,024 tokens "
          f"per rank, {1800 * args.ranks} tokens per step; "
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
