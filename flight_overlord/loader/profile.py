"""`overlord partition`: profile every source, journal the profile, plan the loader actors and hosts.

The profile of a source (``core.partition_plan.SourceProfile``) is measured the way a loader actor
works: its Parquet footers (file states), then ``PROFILE_ROW_GROUPS`` row groups read and
transformed by a ``SourceShare`` (seconds per sample and per input byte, the transformed row
group's bytes as an actor buffers it). It is journaled in ``run_dir/partition/profile.json`` with
a fingerprint of what it depends on (files and their sizes, transform, context length), and
reused while that fingerprint holds. The plan goes to ``run_dir/partition/plan.json``; a config
with ``loader.partition: auto`` loads with it applied (``config/parse.py``), so every role sees
the same actors per source, and ``LocalCluster`` starts the plan's loader hosts.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path

from .. import formats
from ..config import Config, ConfigError
from ..core.order import epoch_order
from ..core.partition_plan import Budget, GiB, PartitionPlan, SourceProfile, plan_partition, render, single_node_advice
from ..journal import write_text_atomic
from .row_groups import SourceShare, read_catalog

log = logging.getLogger(__name__)
PROFILE_ROW_GROUPS = 2  # row groups read per source (the first of its epoch-0 order)


def partition_dir(cfg: Config) -> Path:
    return cfg.run_dir / "partition"


def fingerprint(cfg: Config) -> str:
    """What a profile depends on: each source's files (and sizes), transform and the context length."""
    parts = [cfg.global_batch.context_length]
    for s in cfg.sources:
        sizes = []
        for path in s.files:
            try:
                sizes.append(os.path.getsize(path))
            except OSError:  # a remote file: its name stands for it
                sizes.append(-1)
        transform = (s.transform.name, s.transform.options) if s.transform else (None, None)
        parts.append([s.name, list(s.file_ids), sizes, *transform, s.text_column, s.image_column,
                      *([s.format, s.tokens_column, s.loss_mask_column]
                        if s.tokens_column or s.format != "auto" else [])])
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def profile_source(cfg: Config, name: str, row_groups: int = PROFILE_ROW_GROUPS) -> SourceProfile:
    source = cfg.source(name)
    one = replace(source, loaders=1)  # one actor owning every row group
    catalog = read_catalog(one)
    footer = 0
    for path in one.files:
        with formats.open_chunks(path, one.format) as opened:
            footer += opened.index_bytes
    partition = SourceShare(one, 0, cfg.global_batch.context_length, cfg.vision)
    order = epoch_order(catalog, seed=cfg.seed, source=name, epoch=0)[:max(1, row_groups)]
    seconds = samples = in_bytes = out_bytes = tokens = 0
    try:
        for rg in order:
            in_bytes += partition._file(rg.file).chunk_bytes(rg.row_group, _read_columns(one))
            started = time.perf_counter()
            read = partition.read(rg)
            seconds += time.perf_counter() - started
            samples += rg.num_rows
            out_bytes += read.nbytes + read.remaining.nbytes  # tokens (and images), row flags (keys: made when asked)
            tokens += len(read.tokens.values)
    finally:
        partition.close()
    n = max(1, len(order))
    return SourceProfile(
        name=name, weight=source.weight, row_groups=len(catalog), files=len(one.files),
        rows=sum(rg.num_rows for rg in catalog), mean_tokens=tokens / max(samples, 1),
        seconds_per_sample=seconds / max(samples, 1), seconds_per_byte=seconds / max(in_bytes, 1),
        row_group_bytes=out_bytes / n,
        reader_bytes=float(footer + 64 * 1024 * len(one.files)))  # footers + a reader's state per open file


def _read_columns(source) -> list[str]:
    """The columns a loader reads of the source's files."""
    if source.tokens_column:
        return [c for c in (source.tokens_column, source.loss_mask_column) if c]
    return [c for c in (source.text_column, source.image_column) if c]


def load_or_profile(cfg: Config, *, reprofile: bool = False) -> tuple[list[SourceProfile], bool]:
    """(profiles, reused): the journaled profile when its fingerprint still holds, else measured now."""
    path = partition_dir(cfg) / "profile.json"
    fp = fingerprint(cfg)
    if path.exists() and not reprofile:
        try:
            saved = json.loads(path.read_text())
            same_sources = [p["name"] for p in saved["sources"]] == [s.name for s in cfg.sources]
            if saved.get("fingerprint") == fp and same_sources:
                return [SourceProfile(**p) for p in saved["sources"]], True
        except (ValueError, KeyError, TypeError):
            log.warning("partition: %s is unreadable; profiling again", path)
    started = time.monotonic()
    profile_source(cfg, cfg.sources[0].name, row_groups=1)  # warm-up: the first read pays for imports and caches
    profiles = [profile_source(cfg, s.name) for s in cfg.sources]
    _write_json(path, {"fingerprint": fp, "measured_at": time.time(),
                       "seconds": time.monotonic() - started, "sources": [p.__dict__ for p in profiles]})
    return profiles, False


def budget_of(cfg: Config, cpus: float | None = None, memory_gib: float | None = None) -> Budget:
    """The command line's budget, else the config's (``loader.budget``), else this machine's CPUs and
    half its RAM."""
    cpus = cpus if cpus is not None else cfg.loader.budget.cpus
    memory_gib = memory_gib if memory_gib is not None else cfg.loader.budget.memory_gib
    if cpus is None:
        cpus = float(os.cpu_count() or 1)
    if memory_gib is None:
        import psutil
        memory_gib = psutil.virtual_memory().total / 2 / GiB
    try:
        return Budget(float(cpus), float(memory_gib) * GiB).check()
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc).replace("memory", "memory (GiB)", 1)) from None


def partition(cfg: Config, *, cpus: float | None = None, memory_gib: float | None = None,
              reprofile: bool = False) -> tuple[PartitionPlan, str]:
    """Profile (or reuse the profile), plan within the budget, journal both; (plan, its table)."""
    budget = budget_of(cfg, cpus, memory_gib)
    profiles, reused = load_or_profile(cfg, reprofile=reprofile)
    try:
        plan = plan_partition(profiles, budget, read_ahead_row_groups=cfg.loader.read_ahead_row_groups,
                              read_ahead_bytes=cfg.loader.read_ahead_bytes)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _write_json(partition_dir(cfg) / "plan.json", plan.to_dict())
    table = render(plan, profiles) + "\n" + single_node_advice(plan)
    where = partition_dir(cfg)
    return plan, table + f"\nprofile: {where / 'profile.json'} ({'reused' if reused else 'measured now'}); " \
                         f"plan: {where / 'plan.json'}"


def read_plan(cfg: Config) -> PartitionPlan | None:
    path = partition_dir(cfg) / "plan.json"
    if not path.exists():
        return None
    try:
        return PartitionPlan.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a partition plan ({exc}); run `overlord partition CONFIG` again") from None


def _write_json(path: Path, data: dict) -> None:
    """Indented and sorted: an operator reads these files."""
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))
