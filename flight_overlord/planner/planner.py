"""The Planner's logic, without Flight: its state, planning step after step, the plan journal,
snapshots, and serving any planned step again.

State (``state_dict``) is plain numbers: the next step, each source's read cursor and deferred
backlog, the mixer's credit, and the trainer feedback a dynamic schedule still needs. Every plan
is journaled with the state after it (a differential record), every ``checkpoint_every`` steps a
snapshot notes the journal offset, so restoring reads one snapshot and at most that many records.
A journaled step is served from its record, never planned twice, so a restarted Planner hands out
exactly the plans an undisturbed one would.
"""
from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from ..config import Config
from ..core.mesh import Mesh
from ..core.mixing import Mixer
from ..core.schedules import FeedbackLog, weights_at
from ..store import Journal, Snapshots, read_journal
from ..wire.plan import ConstructorPlan, FetchGroup
from .feed import FetchMeta, SourceFeed
from .hdp import hdp_groups
from .program import StepPlan, plan_step
from .registry import Registry
from .scaling import SourceScaling
from .strategy import Strategy

log = logging.getLogger(__name__)


class Planner:
    def __init__(self, cfg: Config, strategy: Strategy, fetch_meta: Callable[[str], FetchMeta]):
        self.cfg = cfg
        self.strategy = strategy
        self.mesh: Mesh = strategy.mesh
        self.registry = Registry(cfg, self.mesh.num_constructors)
        self.feedback = FeedbackLog(expected=cfg.mesh.dp)  # one report per data-parallel group
        self.next_step = 0
        self.feeds: dict[str, SourceFeed] = {}   # built once every loader has registered (start_feeds)
        self._feed_states: dict[str, dict] = {}  # restored cursors, applied by start_feeds
        self.mixer = Mixer([s.name for s in cfg.sources])
        self._fetch_meta = fetch_meta
        self._dir = cfg.run_dir / "planner"
        self._journal_path = cfg.run_dir / "plan-journal.jsonl"
        self._snapshots = Snapshots(self._dir, "planner", bucket=10 * cfg.checkpoint.every)
        self._journal: Journal | None = None
        self._index: dict[int, int] = {}  # step -> journal offset of its record (steps since the last restore)
        self.rewound_at: int | None = None  # a resume on a new layout re-plans from this step
        self.journal_layout: dict | None = None  # the layout of the run restored from, if any
        self.scaling = SourceScaling(cfg) if cfg.loader.scaling.enabled else None  # live resharding
        self.scaled: list[dict] = []  # the scaling events of the step planned last

    # -- set-up ------------------------------------------------------------------------
    def open(self, *, resume: bool) -> None:
        """Open the journal; with ``resume``, restore the state at its end (a no-op on an empty run_dir)."""
        self._journal = Journal(self._journal_path, fsync=True)
        if resume:
            self._restore_latest()

    def start_feeds(self) -> None:
        """Build the source feeds once every loader has registered (they announce the row groups)."""
        self.feeds = {s.name: SourceFeed(s.name, self.registry.source_row_groups(s.name), self.cfg.seed,
                                         self._fetch_meta(s.name)) for s in self.cfg.sources}
        for name, feed_state in self._feed_states.items():
            self.feeds[name].load_state_dict(feed_state)
        if self.scaling is not None:
            self.scaling.start(self.registry)

    # -- planning ----------------------------------------------------------------------
    def feedback_ready(self, step: int) -> bool:
        """A dynamic schedule plans step s only from the complete feedback of step s - lag."""
        lag = self.strategy.schedule.lag
        return not lag or step < lag or self.feedback.complete(step - lag)

    def plan_next(self) -> StepPlan:
        """Plan ``next_step``, journal it with the state after it, snapshot when due."""
        step = self.next_step
        if step % self.cfg.checkpoint.every == 0:
            self._snapshot()
        weights, feedback = weights_at(self.strategy.schedule, step, self.feedback)
        weights = self._checked_weights(step, weights)
        scaled = self.scaling.decide(step, weights, self.feeds) if self.scaling is not None else []
        self.scaled = scaled  # the server tells the loaders at once (they also learn it from tickets)
        plan = plan_step(step, self.feeds, self.mixer, self.strategy, weights, feedback)
        plan.stats["skipped"] = sum(f.skipped for f in self.feeds.values())
        record = plan.to_record()
        record["state"] = self._planning_state()
        if scaled:
            record["scaling"] = scaled
        offset = self._journal.size()
        self._journal.append(record)
        self._index[step] = offset
        self.next_step = step + 1
        return plan

    def journaled(self, step: int) -> StepPlan | None:
        """A step planned before (by this process or one before it), from the journal."""
        offset = self._index.get(step)
        if offset is None:
            snapshot = self._snapshots.latest(at_most=step)
            if snapshot is None or step >= self.next_step:
                return None
            offset = snapshot[1]["journal_offset"]
        for _, record in read_journal(self._journal_path, offset):
            if record.get("step") == step and "bins" in record and self._usable(record):
                return StepPlan.from_record(record)
            if record.get("step", -1) > step:
                break
        return None

    def _usable(self, record: dict) -> bool:
        return self.rewound_at is None or record["step"] < self.rewound_at or record["step"] in self._index

    def _checked_weights(self, step: int, weights: dict) -> dict[str, float]:
        unknown = sorted(set(weights) - set(self.strategy.sources))
        if unknown:
            raise ValueError(f"the mixing schedule of step {step} names unknown source {unknown[0]!r} "
                             f"(sources: {', '.join(self.strategy.sources)})")
        if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError(f"the mixing schedule of step {step} gave weights {weights}: they must be "
                             f">= 0 with a positive sum")
        return {k: float(v) for k, v in weights.items()}

    # -- feedback ----------------------------------------------------------------------
    def report(self, step: int, rank: int, losses: dict) -> bool:
        """Record one data-parallel group's losses; journaled (fsync'd) before any plan reads them."""
        group = self.mesh.coord(rank).dp
        if not self.feedback.add(step, group, losses):
            return False
        self._journal.append({"report": {"step": step, "group": group, "rank": rank, "losses": losses}})
        return True

    # -- state -------------------------------------------------------------------------
    def _planning_state(self) -> dict:
        feeds = {name: feed.state_dict() for name, feed in self.feeds.items()} if self.feeds else self._feed_states
        scaling = {"scaling": self.scaling.state_dict()} if self.scaling is not None else {}
        return {"feeds": feeds, "mixer": self.mixer.state_dict(), **scaling}

    def state_dict(self) -> dict:
        lag = self.strategy.schedule.lag
        keep = {str(s): {str(g): l for g, l in groups.items()} for s, groups in self.feedback.reports.items()
                if s >= self.next_step - lag - 1}
        return {"next_step": self.next_step, "layout": self.layout(), **self._planning_state(), "feedback": keep}

    def load_state_dict(self, state: dict) -> None:
        self.next_step = int(state["next_step"])
        self.mixer.load_state_dict(state["mixer"])
        if self.scaling is not None and "scaling" in state:
            self.scaling.load_state_dict(state["scaling"])
        self._feed_states = dict(state["feeds"])
        for name, feed_state in self._feed_states.items():
            if name in self.feeds:
                self.feeds[name].load_state_dict(feed_state)
        for step, groups in state["feedback"].items():
            for group, losses in groups.items():
                self.feedback.add(int(step), int(group), losses)

    def layout(self) -> dict:
        return {"axis": self.strategy.axis, "buckets": self.strategy.num_buckets,
                "microbatches": self.cfg.global_batch.microbatches, "capacity": self.strategy.capacity,
                "encoder_axis": self.strategy.image_graph.axis if self.strategy.image_graph else None}

    def _snapshot(self) -> None:
        state = self.state_dict()
        state["journal_offset"] = self._journal.size()
        self._snapshots.write(self.next_step, state)

    def _restore_latest(self) -> None:
        """The state at the end of the journal: the latest snapshot, then the records after it."""
        snapshot = self._snapshots.latest()
        offset = 0
        if snapshot is not None:
            self.load_state_dict(snapshot[1])
            offset = snapshot[1]["journal_offset"]
            self.journal_layout = snapshot[1]["layout"]
        last, begin = None, offset
        for end, record in read_journal(self._journal_path, offset):
            if "report" in record:
                r = record["report"]
                self.feedback.add(r["step"], r["group"], r["losses"])
            elif "rewind" in record:  # plans from that step on were made again, on a new layout
                self._index = {s: o for s, o in self._index.items() if s < record["rewind"]}
                last = record
            elif "bins" in record:
                self._index[record["step"]] = begin
                last = record
            begin = end
        if last is not None:
            self.journal_layout = last["layout"]
            next_step = last["rewind"] if "rewind" in last else last["step"] + 1
            self.load_state_dict({**last["state"], "next_step": next_step, "feedback": {}})
        log.info("restored at step %d (%d journaled steps since the snapshot)", self.next_step, len(self._index))

    def rewind(self, step: int) -> None:
        """Resume on a new layout (say dp 2 -> 4): re-plan from ``step`` with the state the journal had
        after step - 1, forgetting the journaled plans from ``step`` on (their layout no longer fits)."""
        if self.scaling is not None and any(len(s) > 1 for s in self.scaling.segments.values()):
            raise ValueError("resume on a new layout after a live reshard (loader.scaling) is not supported: the "
                             "re-planned steps would reshard at other positions than the loaders journaled; "
                             "resume on the run's own layout")
        state = self._state_before(step)
        self.load_state_dict(state)
        self._journal.append({"rewind": step, "layout": self.layout(), "state": self._planning_state()})
        self._index = {s: o for s, o in self._index.items() if s < step}
        self.rewound_at = step
        log.info("rewound to step %d for a new layout %s", step, self.layout())

    def _state_before(self, step: int) -> dict:
        snapshot = self._snapshots.latest(at_most=step)
        if snapshot is None:
            raise ValueError(f"no snapshot at or before step {step} in {self._dir}")
        state = dict(snapshot[1])
        for _, record in read_journal(self._journal_path, state["journal_offset"]):
            if "bins" in record and record["step"] < step:
                state.update(record["state"])
                state["next_step"] = record["step"] + 1
        state["feedback"] = {}
        return state

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()


def constructor_view(plan: StepPlan, constructor: int, mesh: Mesh, registry: Registry,
                     broadcast: frozenset[str]) -> ConstructorPlan:
    """What one constructor assembles: its buckets' microbatches (and, with an image graph, the
    samples its ranks encode) as indices into ``keys``, the planned length of each sample, and
    where to fetch each one, with how many constructors fetch it in all."""
    if plan.table is not None and plan.encoder is None and plan.axis != "HDP" and _keys_unique(plan):
        return _table_view(plan, constructor, mesh, registry, broadcast)
    consumers = _consumers(plan, mesh)
    index: dict[str, int] = {}
    keys, lengths, fetch = [], [], {}

    def item(pick) -> int:
        ref = pick.ref
        if ref.key not in index:
            index[ref.key] = len(keys)
            actor = registry.owner(ref.source, ref.file, ref.row_group, ref.epoch)
            group = fetch.setdefault(actor, FetchGroup(*actor, registry.locations(actor), [], []))
            group.items.append(len(keys))
            group.samples.append([ref.epoch, ref.file, ref.row_group, ref.row, consumers[ref.key]])
            keys.append(ref.key)
            lengths.append(pick.tokens)
        return index[ref.key]

    microbatches = {b: [[item(p) for p in bin_] for bin_ in plan.bucket_bins(b)]
                    for b in mesh.buckets_of_constructor(constructor, plan.axis)}
    encoder = None
    if plan.encoder is not None:  # [item, image index, owner bucket, owner microbatch] per image a rank encodes
        owner = {p.ref.key: divmod(i, plan.microbatches) for i, bin_ in enumerate(plan.bins) for p in bin_}
        encoder = {b: [[item(p), image, *owner[p.ref.key]] for p, image in plan.encoder[b]]
                   for b in mesh.buckets_of_constructor(constructor, plan.encoder_axis)}
    extra = {"hdp": hdp_groups(plan, microbatches)} if plan.axis == "HDP" else {}
    return ConstructorPlan(plan.step, plan.axis, sorted(broadcast), plan.capacity, keys, lengths, microbatches,
                           list(fetch.values()), plan.encoder_axis, encoder, extra)


def _keys_unique(plan: StepPlan) -> bool:
    """No sample key twice in the step (a small source can wrap into its next epoch within a step:
    the same row twice, which the view by Picks numbers once)."""
    if plan.keys_unique is None:
        plan.keys_unique = len(set(plan.table.keys())) == len(plan.table)
    return plan.keys_unique


def _table_view(plan: StepPlan, constructor: int, mesh: Mesh, registry: Registry,
                broadcast: frozenset[str]) -> ConstructorPlan:
    """``constructor_view`` from the plan's columns, without a Pick per sample: every sample sits in
    one bin (no image graph, no HDP) and once in the step, so this constructor alone fetches it."""
    t, m = plan.table, plan.microbatches
    buckets = mesh.buckets_of_constructor(constructor, plan.axis)
    bins = [plan.bin_indices[b * m + i] for b in buckets for i in range(m)]
    rows = np.concatenate(bins) if bins else np.zeros(0, dtype=np.int64)
    ends = np.cumsum([len(x) for x in bins]).tolist()
    positions = list(range(rows.size))
    flat = [positions[a:b] for a, b in zip([0] + ends[:-1], ends)]
    keys = t.keys()
    epoch, file, group, row = (t.epoch[rows], t.file[rows], t.row_group[rows], t.row[rows])
    # the owning loader actor, asked once per distinct (source, file, row group, epoch)
    distinct, which = np.unique(np.stack([t.source[rows], file, group, epoch], axis=1), axis=0, return_inverse=True)
    owners = [registry.owner(t.sources[s], t.files[f], g, e) for s, f, g, e in distinct.tolist()]
    actors = list(dict.fromkeys(owners))
    actor_of = np.array([actors.index(o) for o in owners], dtype=np.int64)[which.reshape(-1)] if rows.size else rows
    present, first = np.unique(actor_of, return_index=True)
    fetch = []
    files = np.array(t.files + [""], dtype=object)[file].tolist()
    samples = [[e, f, g, r, 1] for e, f, g, r in zip(epoch.tolist(), files, group.tolist(), row.tolist())]
    for a in present[np.argsort(first)].tolist():  # loaders in order of their first sample
        items = np.flatnonzero(actor_of == a).tolist()
        fetch.append(FetchGroup(*actors[a], registry.locations(actors[a]), items, [samples[i] for i in items]))
    return ConstructorPlan(plan.step, plan.axis, sorted(broadcast), plan.capacity, [keys[i] for i in rows.tolist()],
                           t.tokens[rows].tolist(), {b: flat[j * m:(j + 1) * m] for j, b in enumerate(buckets)},
                           fetch, plan.encoder_axis, None, {})


def _consumers(plan: StepPlan, mesh: Mesh) -> dict[str, int]:
    """Per sample, how many constructors fetch it: 2 when an image graph sends its images to a
    rank of another constructor than its sequence's. The loader keeps it until both have."""
    if plan.consumers is None:
        needs: dict[str, set[int]] = {}
        for bucket in range(plan.num_buckets):
            c = mesh.constructor_of(mesh.dp_of_bucket(bucket, plan.axis))
            for bin_ in plan.bucket_bins(bucket):
                for pick in bin_:
                    needs.setdefault(pick.ref.key, set()).add(c)
        for bucket, picks in enumerate(plan.encoder or []):
            c = mesh.constructor_of(mesh.dp_of_bucket(bucket, plan.encoder_axis))
            for pick, _ in picks:
                needs.setdefault(pick.ref.key, set()).add(c)
        plan.consumers = {k: len(v) for k, v in needs.items()}
    return plan.consumers
