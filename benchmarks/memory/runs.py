"""``memory.sources_ranks``'s runs: one flight_overlord cluster or one colocated DataLoader set at S sources x R
ranks, measured by ``rank_processes.run_ranks`` (PSS at its max and at the end, by process kind, and
rates); the corpora they read; the fitted colocated size that skips runs that cannot fit."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.common import rank_processes
from benchmarks.common.benchlib import MiB, cluster_roots, log, write_config
from benchmarks.common.colocated import baseline_rank
from benchmarks.delivery.throughput import overlord_trainer

GiB = 1024 * MiB
FILL = 0.85  # tokens_per_step over the slots
# The measured fit of a colocated set's PSS (per rank, per worker, per source), to skip colocated runs
# that cannot fit in RAM.
FIT_RANK, FIT_WORKER, FIT_SOURCE = 80 * MiB, 40 * MiB, 9.9 * MiB


@dataclass
class Run:
    side: str          # "overlord" / "colocated"
    sources: int
    ranks: int
    hosts: int | str | None  # loader.hosts (overlord): N or auto
    variant: str = ""  # overlord: "default" (the config's read-ahead) or "lean" (read ahead only what is asked)
    max_pss: int = 0
    end_pss: int = 0
    processes: int = 0
    start_s: float = 0.0
    by_label: dict = field(default_factory=dict)  # label -> (processes, PSS) at the max
    cores_by_label: dict = field(default_factory=dict)  # label -> CPU cores its processes used while timed
    batches_per_s: float = 0.0
    samples_per_s: float = 0.0
    error: str = ""

    def label_avg(self, label: str) -> float:
        n, pss = self.by_label.get(label, (0, 0))
        return pss / n if n else 0.0

    def label_sum(self, label: str) -> float:
        return float(self.by_label.get(label, (0, 0))[1])


def _rate(tallies, what: str = "batches") -> float:
    elapsed = max(t.t1 for t in tallies) - min(t.t0 for t in tallies)
    return sum(getattr(t, what) for t in tallies) / elapsed if elapsed > 0 else 0.0


def measured(run: Run, tallies, sampler) -> Run:
    """``run`` with what ``rank_processes.run_ranks`` measured: PSS (max, last, by process kind) and rates."""
    run.max_pss, run.end_pss, run.processes = sampler.max_pss, sampler.end_pss, sampler.processes
    run.by_label, run.batches_per_s = dict(sampler.pss_by_label), _rate(tallies)
    run.cores_by_label = sampler.cores_by_label()
    run.samples_per_s = _rate(tallies, "samples")
    return run


VARIANTS = {"default": {}, "lean": {"read_ahead_bytes": 1}}  # lean: no row group read ahead of the Planner's demand


def loader_settings(variant: str) -> dict:
    """The ``loader`` settings of a variant: a name of ``VARIANTS``, or ``+``-joined read-ahead settings
    for a sweep, ``raN`` (``read_ahead_row_groups: N``), ``bytesNm`` (``read_ahead_bytes``: N MiB;
    ``bytes0m``: no byte bound) and ``slNm`` (``sample_level_bytes``: N MiB), say ``ra8+bytes4m``; other
    names (the deployments of ``benchmarks.memory.peers``) change no loader setting."""
    settings = {}
    for part in variant.split("+"):
        if part in VARIANTS:
            settings.update(VARIANTS[part])
        elif part.startswith("ra") and part[2:].isdigit():
            settings["read_ahead_row_groups"] = int(part[2:])
        elif part.startswith("bytes") and part.endswith("m") and part[5:-1].replace(".", "", 1).isdigit():
            mib = float(part[5:-1])  # bytes0m: no byte bound
            settings["read_ahead_bytes"] = max(1, int(mib * MiB)) if mib else 0
        elif part.startswith("sl") and part.endswith("m") and part[2:-1].replace(".", "", 1).isdigit():
            settings["sample_level_bytes"] = max(1, int(float(part[2:-1]) * MiB))
    return settings


def run_overlord(args, tmp: Path, data_dir: Path, names: list[str], ranks: int, hosts: int | str,
                 variant: str = "default", sections: dict | None = None) -> Run:
    """``sections``: further config sections (say ``constructor``) on top of the variant's loader settings;
    ``hosts`` None: ``loader.hosts`` left to the config's defaults (``deployment: single_node`` sets it)."""
    from flight_overlord.deploy.launch import LocalCluster
    tag = f"o-s{len(names)}-r{ranks}-h{hosts}-{variant}"
    config = write_config(tmp / f"{tag}.yaml", data_dir, [{"name": n, "weight": 1.0} for n in names],
                          ranks=ranks, context_length=args.context_length, microbatches=args.microbatches,
                          tokens_per_step=int(ranks * args.microbatches * args.context_length * FILL),
                          seed=args.seed, run_dir=tmp / f"run-{tag}", balance={"method": "greedy"},
                          **{"loader": {**({} if hosts is None else {"hosts": hosts}), **loader_settings(variant)},
                             **(sections or {})})
    run = Run("overlord", len(names), ranks, hosts, variant)
    cluster = LocalCluster(config)
    try:
        started = time.monotonic()
        planner = cluster.start()
        run.start_s = time.monotonic() - started
        roles = cluster_roots(cluster)
        log(f"[overlord S={len(names)} R={ranks} hosts={hosts} {variant}] {len(roles)} role processes up "
            f"in {run.start_s:.1f}s")
        tallies, sampler = rank_processes.run_ranks(
            rank_processes.TRAINER_SIDE, overlord_trainer,
            [(planner, args.warmup, args.steps, None) for _ in range(ranks)],
            label="trainer", extra_roots=lambda: roles, timeout=args.timeout)
    finally:
        cluster.stop()
    return measured(run, tallies, sampler)


def run_colocated(args, data_dir: Path, names: list[str], ranks: int) -> Run:
    log(f"[colocated S={len(names)} R={ranks} W={args.workers}]")
    sources = [(n, 1.0, 1) for n in names]
    run = Run("colocated", len(names), ranks, None)
    started = time.monotonic()
    tallies, sampler = rank_processes.run_ranks(
        "baseline", baseline_rank,
        [(sources, str(data_dir), ranks, args.workers, args.context_length, args.microbatches,
          args.warmup, args.steps, args.seed) for _ in range(ranks)],
        label="rank", child_label="worker", timeout=args.timeout)
    run.start_s = time.monotonic() - started
    return measured(run, tallies, sampler)


def fitted_colocated(sources: int, ranks: int, workers: int, row_group_mib: float = 0.0) -> float:
    """A worker holds its current row group of every source: ~4.5 bytes of tokens and keys per byte of text."""
    return ranks * (FIT_RANK + workers * (FIT_WORKER + sources * max(FIT_SOURCE, 4.5 * row_group_mib * MiB)))


def sized_corpus(base: Path, out: Path, names: list[str], row_group_mib: float, files: int = 2,
                 groups_per_file: int = 2) -> None:
    """Each source of ``base`` rewritten with row groups of ~``row_group_mib`` MiB of text (real corpora
    have row groups of many MiB; the demo's are ~0.1 MiB): its rows repeated in order until
    ``files x groups_per_file`` row groups are full. Deterministic; kept in ``out`` for the next run."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    for name in names:
        if list((out / name).glob("*.parquet")):
            continue
        table = pa.concat_tables([pq.read_table(p, columns=["text"]) for p in sorted((base / name).glob("*.parquet"))])
        per_row = max(1.0, table.column("text").nbytes / max(table.num_rows, 1))
        rows_per_group = max(1, math.ceil(row_group_mib * MiB / per_row))
        (out / name).mkdir(parents=True, exist_ok=True)
        for f in range(files):
            first = f * groups_per_file * rows_per_group
            rows = (np.arange(first, first + groups_per_file * rows_per_group) % table.num_rows)
            pq.write_table(table.take(pa.array(rows)), out / name / f"part-{f:05d}.parquet",
                           row_group_size=rows_per_group, compression="zstd")


def bare_trainers_pss(ranks: int) -> int:
    """Summed PSS of ``ranks`` bare trainer processes running together (so that they split their shared
    library pages as the real trainers do): torch, numpy, pyarrow and the client imported, no data."""
    import subprocess
    import sys

    import psutil
    code = ("import torch, numpy, pyarrow.flight, sys, time; from flight_overlord import TrainerClient; "
            "print('ready', flush=True); time.sleep(120)")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(ranks)]
    try:
        for proc in procs:
            proc.stdout.readline()
        time.sleep(1.0)
        return sum(psutil.Process(p.pid).memory_full_info().pss for p in procs)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def ensure_many(data_dir: Path, n: int, args) -> list[str]:
    from flight_overlord.demo.data import make_many_sources, many_source_names
    names = many_source_names(n)
    if not all(list((data_dir / s).glob("*.parquet")) for s in names):
        started = time.monotonic()
        make_many_sources(data_dir, n, seed=args.seed, rows_per_source=args.rows_per_source)
        log(f"corpus: {n} sources in {data_dir} ({time.monotonic() - started:.0f}s)")
    return names
