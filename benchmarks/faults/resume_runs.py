"""``faults.kill_and_resume`` part 2: a full-cluster kill at step N, then mode="resume": time to the first batch."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common.benchlib import log, write_config
from benchmarks.faults.kill_runs import SEED, SOURCES, med, run_dir_bytes
from flight_overlord.client import TrainerClient
from flight_overlord.config import load_config
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.harness import each_rank, fetch_steps
from flight_overlord.journal import Snapshots, journal_size, read_journal
from flight_overlord.loader.state import LoaderState
from flight_overlord.planner.planner import Planner
from flight_overlord.planner.strategy import load_strategy

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
                journal = journal_size(cfg.run_dir / "plan-journal.jsonl")
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
