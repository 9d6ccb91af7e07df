"""Journaled steps served again without their samples in the journal: re-derived, then checked.

A plan is a pure function of (config, seed, step, the planning state before the step, the
sources' metadata, and the step's inputs that no state gives: its weights, whether the mixer's
credit was reset there, the fitted cost model in force). So a step's journal record holds those
inputs, the state after the step and a digest of the plan served, not the plan: its size follows
the number of sources, not of samples (a whole plan is ~12 KB per step at dp 64 and MBs at dp 4096).

Serving step s again reads the state before it (step s - 1's record, or the snapshot or rewind just
before s), plans s once more and compares the digest; a mismatch is an error naming the step, never
another plan. Replay cost is one step's planning plus a journal read bounded by the snapshot
interval; what needs every step (an audit) replays the journal once, start to end (``in_force``).
The metadata comes from the loaders (a live Planner) or from the source files themselves (offline:
an audit), read once per row group; the files are fingerprinted, so a changed file is an error at
resume already. A run's config is kept per start (``ConfigHistory``), so a step planned
before a resume on an edited config or another layout is re-derived with the config it was planned with.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..config import Config
from ..core.mixing import Mixer
from ..core.order import ReadOrder, RowGroupRef
from ..core.skips import window
from ..journal import read_journal
from ..source_catalog import cached_catalog
from ..wire.plan_channel import PLAN_AHEAD
from .costing import cost_fns
from .feed import FetchMeta, SourceFeed, row_group_metadata
from .run_inputs import ConfigHistory, JsonFile, Unreadable
from .skips import plan_step_dropping
from .step_plan import StepPlan

log = logging.getLogger(__name__)
META_CACHED = 8  # row groups' metadata kept per source while replaying (consecutive steps share them)


class PlanMismatch(RuntimeError):
    """A re-derived step differs from the plan that was served: never serve it."""


def is_plan(record: dict) -> bool:
    """A step's record: re-derivable (``digest``), or a whole plan as journals before held (``bins``)."""
    return "step" in record and ("digest" in record or "bins" in record)


def plan_digest(plan: StepPlan) -> str:
    """A digest of what a plan serves: every bin's samples (source, file, row group, row, epoch,
    planned length and patches) in order, the weights and the layout. From the columns when the plan
    has them (no object per sample), else from its record."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps([plan.step, plan.layout(), plan.weights], sort_keys=True).encode())
    if plan.table is not None and plan.bin_indices is not None:
        t = plan.table
        order = np.concatenate(plan.bin_indices) if plan.bin_indices else np.zeros(0, np.int64)
        h.update(json.dumps([t.sources, t.files, [len(b) for b in plan.bin_indices]]).encode())
        for name in ("source", "file", "epoch", "row_group", "row", "tokens", "patches"):
            h.update(np.ascontiguousarray(t.columns[name][order], dtype=np.int64).tobytes())
        if t.image_sizes is not None:
            h.update(repr(t.image_sizes[order].tolist()).encode())
    else:
        record = plan.to_record()
        h.update(json.dumps([record["bins"], record["samples"]], sort_keys=True).encode())
    if plan.encoder is not None:
        h.update(json.dumps([[[p.ref.key, i] for p, i in b] for b in plan.encoder]).encode())
    return h.hexdigest()


def step_record(plan: StepPlan, weights: dict, reset_credit: bool, costs: dict[str, list[float]],
                drop: tuple[int, int] | None = None) -> dict:
    """A step's journal record, without its samples: the step's own inputs (``weights`` as given to
    planning, before any buffer policy; the credit reset; the cost models in force as [a, b]; whether
    the steps whose draws were dropped before it, ``overlord skip``) and the plan's digest, weights, stats
    and feedback."""
    record = {"step": plan.step, "layout": plan.layout(), "weights": plan.weights, "stats": plan.stats,
              "digest": plan_digest(plan)}
    if plan.feedback is not None:
        record["feedback"] = plan.feedback
    inputs: dict = {}
    if weights != plan.weights:
        inputs["weights"] = weights
    if reset_credit:
        inputs["reset_credit"] = True
    if costs:
        inputs["cost"] = costs
    if drop:
        inputs["drop_steps"] = list(drop)
    if inputs:
        record["inputs"] = inputs
    return record


def walk(path: Path, offset: int = 0, before: dict | None = None) -> Iterator[tuple[int, dict, dict | None]]:
    """(offset, record, the planning state before it) of every record of the journal from ``offset``
    on, ``before`` being the state there (a snapshot's; None: unknown): a rewind or a step's record
    leaves the state the records after it start from."""
    begin = offset
    for end, record in read_journal(path, offset):
        yield begin, record, before
        if "rewind" in record:
            before = record["state"]
        elif is_plan(record):
            before = record.get("state")
        begin = end


def locate(path: Path, offset: int, step: int, before: dict | None) -> tuple[dict | None, dict, int] | None:
    """(the planning state before ``step``, its record, the record's offset), reading the journal from
    ``offset`` where ``before`` is the state (a snapshot's, or None when a rewind record comes first)."""
    for begin, record, state in walk(path, offset, before):
        if is_plan(record) and record["step"] >= step:
            return (state, record, begin) if record["step"] == step else None
    return None


class SourceReader:
    """Fresh ``SourceFeed``s of one config, for replaying: row groups and metadata from the loaders
    (``fetch_meta``, ``row_groups``), or, offline, from the source files; metadata cached per row
    group, each source's read order per epoch (``ReadOrder``)."""

    def __init__(self, cfg: Config, unreadable: Unreadable, fetch_meta: Callable[[str], FetchMeta] | None = None,
                 row_groups: Callable[[str], list[RowGroupRef] | None] | None = None):
        """``row_groups``: a source's row groups as its loaders registered them (offline: as journaled
        at the start, None when not: then as the files have them now)."""
        self.cfg, self.unreadable = cfg, unreadable
        self._fetch_meta, self._row_groups = fetch_meta, row_groups
        self._sources: dict[str, tuple[ReadOrder, FetchMeta]] = {}

    def feed(self, name: str, offset: int) -> SourceFeed:
        """A feed at the start of source ``name``, for re-deriving the record at journal offset ``offset``."""
        if name not in self._sources:
            row_groups, meta = self._open(name)
            self._sources[name] = ReadOrder(name, row_groups, self.cfg.seed, self.cfg.source(name).shuffle_window), meta
        order, meta = self._sources[name]
        return SourceFeed.over(order, self.unreadable.applied(name, meta, offset))

    def _open(self, name: str) -> tuple[list[RowGroupRef], FetchMeta]:
        if self._fetch_meta is not None:
            fetch = self._fetch_meta(name)
            cached = lru_cache(maxsize=META_CACHED)(
                lambda epoch, file, group, rows: fetch(epoch, RowGroupRef(file, group, rows)))
            return self._row_groups(name), lambda epoch, rg: cached(epoch, rg.file, rg.row_group, rg.num_rows)
        catalog, meta = files_metadata(self.cfg, name)
        registered = self._row_groups(name) if self._row_groups is not None else None
        return (registered if registered is not None else catalog), meta


def files_metadata(cfg: Config, name: str) -> tuple[list[RowGroupRef], FetchMeta]:
    """A source's row groups and their metadata read from its files, as its loaders report them (an
    unreadable row group: every row -1, which planning skips, as a loader's failed read)."""
    from ..core.vision import ImageError
    from ..loader.row_groups import RowGroupSamples, SourceShare
    share = SourceShare(cfg.source(name), 0, cfg.global_batch.context_length, cfg.vision)

    @lru_cache(maxsize=META_CACHED)
    def read(file: str, row_group: int, rows: int) -> dict:
        rg = RowGroupRef(file, row_group, rows)
        try:
            samples = share.read(rg)
        except ImageError:
            raise
        except Exception as exc:  # noqa: BLE001 - as the loader: a row group it cannot read is skipped
            log.warning("source %s: cannot read %s row group %d (%s): replayed as skipped", name, file, row_group, exc)
            samples = RowGroupSamples.failed_read(name, rg)
        return row_group_metadata(samples.metadata(), rows)
    return share.catalog, lambda epoch, rg: read(rg.file, rg.row_group, rg.num_rows)


def derive(record: dict, offset: int, before: dict, strategy, reader: SourceReader) -> StepPlan:
    """Plan ``record``'s step (journaled at ``offset``) again from the state ``before`` it, with the
    step's journaled inputs; checked against the journaled digest."""
    step = record["step"]
    mixer = Mixer(list(before["mixer_sources"]))
    mixer.load_state_dict(before["mixer"])
    feeds = {}
    for name in mixer.sources:
        feeds[name] = reader.feed(name, offset)
        if name in before["feeds"]:
            feeds[name].load_state_dict(before["feeds"][name])
    inputs = record.get("inputs", {})
    if inputs.get("reset_credit"):
        mixer.reset_credit()
    cost = cost_fns(inputs.get("cost", {}))
    plan = plan_step_dropping(step, feeds, mixer, strategy, inputs.get("weights", record["weights"]),
                              record.get("feedback"), drop=inputs.get("drop_steps"),
                              cost_fn=cost.get("backbone"), encoder_cost_fn=cost.get("encoder"))
    if plan_digest(plan) != record["digest"]:
        raise PlanMismatch(f"step {step}: planned again from the journal, its plan differs from the one served "
                           f"(digest {record['digest']}): a source file or the strategy changed since; "
                           f"refusing to serve another plan")
    plan.stats = record["stats"]
    return plan


def state_before(path: Path, snapshot: dict, step: int) -> dict:
    """The planning state the journal had after step - 1 (from ``snapshot``, taken at or before
    ``step``, and the records after it), with the live reweightings set since, as overrides."""
    state = dict(snapshot)
    mixes: list[dict] = []
    skips: list[dict] = []
    for _, record, _ in walk(path, state["journal_offset"]):
        if is_plan(record) and record["step"] < step:
            state.update(record["state"])
            state["next_step"] = record["step"] + 1
            mixes, skips = [], []
        elif "mix" in record:
            mixes.append(record["mix"])
        elif "skip" in record:
            skips.append(record["skip"])
    state["overrides"] = state.get("overrides", []) + [[m["step"], m["weights"]] for m in mixes]
    state["skips"] = state.get("skips", []) + [window(s["first"], s["last"], s.get("planned_to", 0)) for s in skips]
    state["feedback"] = {}
    return state


class Replayer:
    """Journaled steps of one run served again: the recent ones from memory, the others re-derived
    with the config in force when they were planned (``fetch_meta``/``row_groups``: the loaders', for
    the run's current config; None offline, then from the files)."""

    def __init__(self, cfg: Config, strategy, journal_path: Path, snapshots,
                 fetch_meta: Callable[[str], FetchMeta] | None, row_groups: Callable[[str], list[RowGroupRef]]):
        self.cfg, self.strategy = cfg, strategy
        self.journal_path, self.snapshots = journal_path, snapshots
        self._rewinds = JsonFile(journal_path.parent / "planner" / "rewinds.json", [])
        self.recent = RecentPlans(max(4, cfg.prefetch + PLAN_AHEAD + 2))
        self.configs = ConfigHistory(journal_path.parent / "planner" / "configs.json", cfg)
        self.unreadable = Unreadable(journal_path.parent / "planner" / "unreadable.json")
        self._live = SourceReader(cfg, self.unreadable, fetch_meta, row_groups) if fetch_meta is not None else None
        self._readers: dict[int, SourceReader] = {}  # offline, per start of the run

    def rewinds(self) -> list[list[int]]:
        """[step, journal offset] of every rewind: a step's plan in force is the first one journaled
        after the last rewind at or before it (plans journaled before were made on the old layout or mixture)."""
        return self._rewinds.read()

    def add_rewind(self, step: int, offset: int) -> None:
        self._rewinds.write(self.rewinds() + [[step, offset]])

    def compact(self, journal) -> None:
        """Bound the journal file to what a restart or a live rank reads: the records from the oldest
        of the newest snapshots on stay, older ones go to the archive (an audit and a rewind to an
        old step read it). Only once they are at least as many bytes as what stays (amortised)."""
        steps = self.snapshots.steps()
        if len(steps) < self.snapshots.keep:
            return
        oldest = self.snapshots.latest(at_most=steps[-self.snapshots.keep])
        cut = oldest[1]["journal_offset"] if oldest is not None else 0
        if cut - journal.start >= max(1, journal.size() - cut):
            journal.compact(cut)

    def plan(self, step: int) -> StepPlan | None:
        """Step ``step``'s plan in force: the first journaled after the last rewind at or before it."""
        plan = self.recent.get(step)
        if plan is not None:
            return plan
        snapshot = self.snapshots.latest(at_most=step)
        if snapshot is None:
            return None
        rewinds = [o for r, o in self.rewinds() if r <= step and o > snapshot[1]["journal_offset"]]
        offset, before = (max(rewinds), None) if rewinds else (snapshot[1]["journal_offset"], snapshot[1])
        found = locate(self.journal_path, offset, step, before)
        if found is None:
            return None
        plan = self.replayed(*found)
        self.recent.put(plan)
        return plan

    def records(self) -> Iterator[dict]:
        """Every step record of the journal in its order (steps planned again after a rewind appear
        again), each with its plan's ``bins`` and ``samples`` re-derived: what a journal held before."""
        for record, plan in self._replay(lambda offset, record: True):
            yield {**record, **plan.to_record()}

    def in_force(self) -> Iterator[StepPlan]:
        """The plan in force of every journaled step (what ``plan(step)`` serves), in journal order, in
        one pass: a plan a later rewind at or before its step superseded is neither derived nor given."""
        rewinds, given = self.rewinds(), set()

        def wanted(offset: int, record: dict) -> bool:
            step = record["step"]
            if step in given or any(r <= step and o > offset for r, o in rewinds):
                return False
            given.add(step)
            return True
        for _, plan in self._replay(wanted):
            yield plan

    def _replay(self, wanted: Callable[[int, dict], bool]) -> Iterator[tuple[dict, StepPlan]]:
        """(record, plan) of the step records ``wanted(offset, record)`` picks, in one pass over the
        journal: each plan from the state the record before it left (the first: from a snapshot)."""
        for begin, record, before in walk(self.journal_path):
            if not is_plan(record):
                continue
            if before is None and "bins" not in record:  # no state known before it (the journal's start)
                snapshot = self.snapshots.latest(at_most=record["step"])
                before = snapshot[1] if snapshot is not None else None
            if wanted(begin, record):
                yield record, self.replayed(before, record, begin)

    def replayed(self, before: dict | None, record: dict, offset: int) -> StepPlan:
        """``record``'s plan (journaled at ``offset``), from the state ``before`` it."""
        if "bins" in record:  # a journal of before re-deriving: the whole plan is there
            return StepPlan.from_record(record)
        if before is None:
            raise KeyError(f"step {record['step']}: no planning state before it in the journal")
        index, entry, in_force = self.configs.at(offset)
        if in_force is None and self._live is not None:
            return derive(record, offset, before, self.strategy, self._live)
        cfg, strategy = in_force or (self.cfg, self.strategy)
        if index not in self._readers:
            self._readers[index] = SourceReader(cfg, self.unreadable, row_groups=registered_row_groups(entry))
        return derive(record, offset, before, strategy, self._readers[index])


def registered_row_groups(entry: dict | None) -> Callable[[str], list[RowGroupRef] | None]:
    """A source's row groups as its loaders registered them at the start ``entry`` of ``planner/configs.json``
    notes: its catalog by digest, or listed (runs of before catalogs); None when neither is known (then
    the files as they are now)."""
    listed = (entry or {}).get("row_groups", {})
    digests = (entry or {}).get("catalogs", {})

    def row_groups(name: str) -> list[RowGroupRef] | None:
        if name in listed:
            return [RowGroupRef(*rg) for rg in listed[name]]
        catalog = cached_catalog(digests[name]) if name in digests else None
        if name in digests and catalog is None:
            log.warning("source %s: catalog %s of the run is not in the catalog cache: replayed with its files as "
                        "they are now", name, digests[name])
        return catalog.row_groups() if catalog is not None else None
    return row_groups


class RecentPlans:
    """The plans served last, by step: live serving hands them out again without re-deriving."""

    def __init__(self, size: int):
        self.size = size
        self._plans: OrderedDict[int, StepPlan] = OrderedDict()
        self._lock = threading.Lock()  # planning puts, serving threads get

    def get(self, step: int) -> StepPlan | None:
        with self._lock:
            plan = self._plans.get(step)
            if plan is not None:
                self._plans.move_to_end(step)
            return plan

    def put(self, plan: StepPlan) -> None:
        with self._lock:
            self._plans[plan.step] = plan
            self._plans.move_to_end(plan.step)
            while len(self._plans) > self.size:
                self._plans.popitem(last=False)

    def forget_from(self, step: int) -> None:
        with self._lock:
            for s in [s for s in self._plans if s >= step]:
                del self._plans[s]
