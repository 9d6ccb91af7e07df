"""The Planner's logic, without Flight: its state, planning step after step, the plan journal,
snapshots, and serving any planned step again.

State (``state_dict``) is plain numbers: the next step, each source's read cursor and deferred
backlog, the mixer's credit, and the trainer feedback a dynamic schedule still needs. Every step is
journaled with the state after it and its own inputs, plus a digest of its plan, not the plan
(``replay.py``); every ``checkpoint_every`` steps a snapshot notes the journal offset, so restoring
reads one snapshot and at most that many records. A journaled step is served again re-derived from
the state before it and checked against its digest, so a restarted Planner hands out exactly the
plans an undisturbed one would (or says which step it cannot).
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from ..config import Config
from ..core.mesh import Mesh
from ..core.mixing import Mixer
from ..core.schedules import FeedbackLog, weights_at
from ..core.skips import StepSkips
from ..journal import Journal, Snapshots, read_journal
from . import costing
from .costing import PlannedCost
from .edits import MixOverrides, describe_edit, mixture_of
from .feed import FetchMeta, SourceFeed
from .live_edits import LiveEdits
from .program import StepPlan
from .replay import Replayer, is_plan, state_before, step_record
from .routes import LoaderRoutes
from .shape import batch_of, layout_of
from .skips import plan_step_dropping
from .strategy import Strategy

log = logging.getLogger(__name__)


class Planner(LiveEdits):
    def __init__(self, cfg: Config, strategy: Strategy, fetch_meta: Callable[[str], FetchMeta] | None,
                 routes: LoaderRoutes | None = None):
        """``fetch_meta``: a source's metadata from its loaders; None offline (an audit): from its files.
        ``routes``: the roster and live resharding, shared with what addresses the loaders (default: its own)."""
        self.cfg = cfg
        self.strategy = strategy
        self.mesh: Mesh = strategy.mesh
        self.routes = routes or LoaderRoutes.of(cfg, self.mesh.num_constructors)
        self.roster = self.routes.roster
        self.feedback = FeedbackLog(expected=cfg.mesh.dp)  # one report per data-parallel group
        self.next_step = 0
        self.feeds: dict[str, SourceFeed] = {}   # built once every loader has registered (start_feeds)
        self._feed_states: dict[str, dict] = {}  # restored cursors, applied by start_feeds
        self.mixer = Mixer([s.name for s in cfg.sources])
        self.mixture = mixture_of(cfg)  # sources, weights, loaders, strategy: journaled with the state
        self.journal_mixture: dict | None = None  # the mixture of the run restored from, if any
        self.overrides = MixOverrides()  # live reweighting (overlord mix), journaled
        self.last_weights: dict[str, float] | None = None  # the weights of the step planned last (status)
        self.skips = StepSkips()  # windows of steps whose samples are dropped (overlord skip, skip:), journaled
        self.skips_replan = False  # the config set a skip of steps already planned: re-plan from the resume step
        self.batch = batch_of(cfg)  # journaled with the state: a resume on another batch re-plans
        self.journal_batch: list | None = None  # the batch of the run restored from (None: not journaled)
        self._planning = threading.Lock()  # a live mix lands wholly before or after a step's planning
        self._fetch_meta = fetch_meta
        self._dir = cfg.run_dir / "planner"
        self._journal_path = cfg.run_dir / "plan-journal.jsonl"
        self._snapshots = Snapshots(self._dir, "planner", bucket=10 * cfg.checkpoint.every)
        self._journal: Journal | None = None
        self.replayer = Replayer(cfg, strategy, self._journal_path, self._snapshots, fetch_meta,
                                 self.roster.source_row_groups)  # journaled steps, served again
        self.journal_layout: dict | None = None  # the layout of the run restored from, if any
        self.scaling = self.routes.scaling  # live resharding, or None
        self.scaled: list[dict] = []  # the scaling events of the step planned last
        self.costs: dict[str, PlannedCost] = {}  # cost.fit: the models fitted to the trainers' timings
        if cfg.cost.fit:
            self.costs["backbone"] = costing.backbone(cfg, strategy, cfg.cost.lag, cfg.cost.window)
            if cfg.cost.fit_encoder:
                self.costs["encoder"] = costing.encoder(cfg, strategy, cfg.cost.lag, cfg.cost.window)

    # -- set-up ------------------------------------------------------------------------
    def open(self, *, resume: bool, guard: Callable[[], None] | None = None) -> None:
        """Open the journal; with ``resume``, restore the state at its end (a no-op on an empty run_dir).
        ``guard``: called before every record (``Journal``): a fenced Planner journals nothing."""
        self._journal = Journal(self._journal_path, fsync=True, guard=guard)
        if resume:
            self._restore_latest()
        if self._fetch_meta is not None:  # a Planner that plans (not an offline reader)
            self.replayer.configs.note(self._journal.synced_size())  # an offset an OS crash cannot take back
            for first, last in self.skips.new_in(self.cfg.skip):
                self._add_skip(first, last, "config")
                self.skips_replan = self.skips_replan or first < self.next_step

    def start_feeds(self) -> None:
        """Build the source feeds once every loader has registered (they announce the row groups). A
        source in the restored state but not in the config (dropped) keeps its cursor in the state; a
        source in the config but not in the state (added) starts at epoch 0."""
        watched = self.replayer.unreadable.watched  # notes where a row group's reads start or stop failing
        self.feeds = {s.name: SourceFeed(s.name, self.roster.source_row_groups(s.name), self.cfg.seed,
                                         watched(s.name, self._fetch_meta(s.name), self._journal.synced_size),
                                         s.shuffle_window) for s in self.cfg.sources}
        for name, feed_state in self._feed_states.items():
            if name in self.feeds:
                self.feeds[name].load_state_dict(feed_state)
        self.replayer.configs.note_catalogs(dict(self.roster.catalogs))
        if self.scaling is not None:
            self.scaling.start(self.roster)

    # -- planning ----------------------------------------------------------------------
    def feedback_ready(self, step: int) -> bool:
        """A dynamic schedule plans step s only from the complete feedback of step s - lag."""
        lag = self.strategy.schedule.lag
        if not all(cost.ready(step) for cost in self.costs.values()):
            return False
        return not lag or step < lag or self.feedback.complete(step - lag)

    def plan_next(self) -> StepPlan:
        """Plan ``next_step``, journal it with the state after it, snapshot when due."""
        with self._planning:
            return self._plan_next()

    def _plan_next(self) -> StepPlan:
        step = self.next_step
        if step % self.cfg.checkpoint.every == 0:
            self._snapshot()
        self.feedback.forget_before(step - self.strategy.schedule.lag - 1)  # what state_dict keeps
        weights, feedback = weights_at(self.strategy.schedule, step, self.feedback)
        reset_credit = self.overrides.starts_at(step)
        if reset_credit:
            self.mixer.reset_credit()
        weights = self._checked_weights(step, self.overrides.weights_at(step) or weights)
        self.last_weights = weights
        scaled = self.scaling.decide(step, weights, self.feeds) if self.scaling is not None else []
        self.scaled = scaled  # the server tells the loaders at once (they also learn it from tickets)
        cost_fns, cost_params = {}, {}
        for name, cost in self.costs.items():
            cost_fns[name], fit_record = cost.decide(step)
            cost_params[name] = [cost.in_force.a, cost.in_force.b]
            if fit_record is not None:
                self._journal.append(fit_record)
        drop = self.skips.to_drop(step)
        plan = plan_step_dropping(step, self.feeds, self.mixer, self.strategy, weights, feedback, drop=drop,
                                  cost_fn=cost_fns.get("backbone"), encoder_cost_fn=cost_fns.get("encoder"))
        for cost in self.costs.values():
            cost.planned(plan)
        plan.stats["skipped"] = sum(f.skipped for f in self.feeds.values())
        record = step_record(plan, weights, reset_credit, cost_params, drop)
        record["state"] = self._planning_state()
        if scaled:
            record["scaling"] = scaled
        # A step record is derived (a pure function of the state before it and the inputs journaled
        # durably: reports, edits, fits, scaling events): not fsync'd alone. An OS crash may lose only
        # the last such records, which a restart plans again, the same; a process's death loses none.
        self._journal.append(record, durable=bool(scaled))
        self.replayer.recent.put(plan)
        self.next_step = step + 1
        return plan

    def journaled(self, step: int) -> StepPlan | None:
        """A step planned before (by this process or one before it): served last, or re-derived from
        the state before it and checked against its digest (``replay.PlanMismatch`` if it differs)."""
        return None if step >= self.next_step else self.replayer.plan(step)

    def check_rewind(self, rank: int, step: int) -> None:
        """A rank that goes back to a planned step (a trainer restarted from a checkpoint) gets it again
        as it was, if the journal can still serve it (``rewind_floor``); else a refusal saying what to do."""
        if step >= self.next_step:
            return
        floor = self.rewind_floor()
        if step < floor:
            raise ValueError(f"rank {rank} cannot go back to step {step}: this run's journal serves steps again "
                             f"from step {floor} on (its oldest planner snapshot, or a resume on a new layout); "
                             f"load a checkpoint of step {floor} or later")

    def rewind_floor(self) -> int:
        """The earliest step a trainer may go back to: the journal serves a step again from the snapshot
        at or before it (``planner/planner-STEP.json``; the first of every ``10 x checkpoint.every``
        steps stays), and plans before the last rewind on a new layout or mixture are not this run's."""
        steps = self._snapshots.steps()
        layout_rewinds = [step for step, _ in self.replayer.rewinds()]
        return max([steps[0] if steps else self.next_step, *layout_rewinds])

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

    def check_compute_report(self, body: dict) -> None:
        """A report's timings name a fitted model: ``compute_seconds`` (cost.fit), ``encoder_seconds``
        (cost.fit_encoder)."""
        for field, model, setting in (("compute_seconds", "backbone", "cost: {fit: true}"),
                                      ("encoder_seconds", "encoder", "cost: {fit: true, fit_encoder: true}")):
            if body.get(field) is not None and model not in self.costs:
                raise ValueError(f"report: {field} given, but this run does not fit that cost model ({setting})")

    def cost_status(self) -> dict:
        """The cost model in force: fitted (``cost.fit``) or as configured."""
        if self.costs:
            encoder = {"encoder": self.costs["encoder"].status(self.next_step)} if "encoder" in self.costs else {}
            return {"fit": True, **self.costs["backbone"].status(self.next_step), **encoder}
        params = self.strategy.cost_params or {}
        return {"fit": False, "model": self.cfg.cost.model, "a": params.get("a"), "b": params.get("b")}

    def report_compute(self, step: int, rank: int, seconds, model: str = "backbone") -> bool:
        """Record one bucket's measured seconds of ``step`` for a fitted model, journaled as rows."""
        cost = self.costs[model]
        axis = self.strategy.axis if model == "backbone" else self.strategy.image_graph.axis
        bucket = self.mesh.bucket_of(rank, axis)
        plan = None if cost.knows_shapes(step) else self.journaled(step)
        rows = cost.rows(step, bucket, seconds, plan)
        if not cost.add(step, bucket, rows):
            return False
        self._journal.append({"compute": {"model": model, "step": step, "bucket": bucket, "rank": rank, "rows": rows}})
        return True

    # -- state -------------------------------------------------------------------------
    def _planning_state(self) -> dict:
        feeds = dict(self._feed_states)  # dropped sources' cursors stay, so re-adding one continues there
        feeds.update((name, feed.state_dict()) for name, feed in self.feeds.items())
        scaling = {"scaling": self.scaling.state_dict()} if self.scaling is not None else {}
        return {"feeds": feeds, "mixer": self.mixer.state_dict(), "mixer_sources": self.mixer.sources,
                "mixture": self.mixture, "overrides": self.overrides.state_dict(), "skips": self.skips.state_dict(),
                "batch": self.batch, **scaling}

    def state_dict(self) -> dict:
        lag = self.strategy.schedule.lag
        keep = {str(s): {str(g): losses for g, losses in groups.items()} for s, groups in self.feedback.reports.items()
                if s >= self.next_step - lag - 1}
        cost = {"cost_fit": {name: c.state_dict() for name, c in self.costs.items()}} if self.costs else {}
        return {"next_step": self.next_step, "layout": self.layout(), **self._planning_state(), "feedback": keep,
                **cost}

    def load_state_dict(self, state: dict) -> None:
        self.next_step = int(state["next_step"])
        self.feedback.floor = min(self.feedback.floor, self.next_step - self.strategy.schedule.lag - 1)  # a rewind
        self.mixer.load_state_dict(_mixer_state(state["mixer"], state.get("mixer_sources"), self.mixer.sources))
        self.overrides.load_state_dict(state.get("overrides", []))
        self.skips.load_state_dict(state.get("skips", []))
        if "mixture" in state:
            self.journal_mixture = state["mixture"]
        self.journal_batch = state.get("batch", self.journal_batch)
        if self.scaling is not None and "scaling" in state:
            self.scaling.load_state_dict(state["scaling"])
        self._feed_states = dict(state["feeds"])
        for name, feed_state in self._feed_states.items():
            if name in self.feeds:
                self.feeds[name].load_state_dict(feed_state)
        for name, cost_state in state.get("cost_fit", {}).items():  # adds to what it holds: first report wins
            if name in self.costs:
                self.costs[name].load_state_dict(cost_state)
        for step, groups in state["feedback"].items():
            for group, losses in groups.items():
                self.feedback.add(int(step), int(group), losses)

    def layout(self) -> dict:
        return layout_of(self.strategy)

    def _snapshot(self) -> None:
        # The offset first, then the state: a report or timing journaled (under the service's lock,
        # not this one) in between is in the tail a restore reads, and maybe in the state too (harmless:
        # the first report of a group or bucket wins). State first would miss it in both.
        offset = self._journal.synced_size()  # a snapshot covers only durable records
        state = self.state_dict()
        state["journal_offset"] = offset
        self._snapshots.write(self.next_step, state)
        self.replayer.compact(self._journal)

    def _restore_latest(self) -> None:
        """The state at the end of the journal: the latest snapshot, then the records after it."""
        snapshot = self._snapshots.latest()
        offset = 0
        if snapshot is not None:
            self.load_state_dict(snapshot[1])
            offset = snapshot[1]["journal_offset"]
            self.journal_layout = snapshot[1]["layout"]
        last, mixes, skips = None, [], []
        for _, record in read_journal(self._journal_path, offset):
            if "report" in record:
                r = record["report"]
                self.feedback.add(r["step"], r["group"], r["losses"])
            elif "compute" in record and record["compute"].get("model", "backbone") in self.costs:
                c = record["compute"]
                self.costs[c.get("model", "backbone")].add(c["step"], c["bucket"], c["rows"])
            elif "cost_fit" in record and record["cost_fit"].get("model", "backbone") in self.costs:
                self.costs[record["cost_fit"].get("model", "backbone")].restore(record["cost_fit"])
            elif "mix" in record:  # a live reweighting: in the state of the plans after it
                mixes.append(record["mix"])
            elif "skip" in record:  # likewise a skip
                skips.append(record["skip"])
            elif "rewind" in record or is_plan(record):  # a rewind: plans from that step on were made again
                last, mixes, skips = record, [], []
        if last is not None:
            self.journal_layout = last["layout"]
            next_step = last["rewind"] if "rewind" in last else last["step"] + 1
            self.load_state_dict({**last["state"], "next_step": next_step, "feedback": {}})
        for mix in mixes:
            self.overrides.add(mix["step"], mix["weights"])
        for skip in skips:
            self.skips.add(skip["first"], skip["last"], planned_to=skip.get("planned_to", 0))
        log.info("restored at step %d", self.next_step)

    def rewind(self, step: int) -> None:
        """Resume on a new layout (say dp 2 -> 4): re-plan from ``step`` with the state the journal had
        after step - 1, forgetting the journaled plans from ``step`` on (their layout no longer fits)."""
        if self.scaling is not None and any(len(s) > 1 for s in self.scaling.segments.values()):
            raise ValueError("resume on a new layout after a live reshard (loader.scaling) is not supported: the "
                             "re-planned steps would reshard at other positions than the loaders journaled; "
                             "resume on the run's own layout")
        state = self._state_before(step)
        self.load_state_dict(state)
        self.skips.replan_from(step)
        edit = self._config_edit(step)
        offset = self._journal.size()
        self._journal.append({"rewind": step, "layout": self.layout(), "state": self._planning_state()})
        self.replayer.add_rewind(step, offset)
        if edit is not None:
            self._journal.append({"edit": edit})
        self.replayer.recent.forget_from(step)
        log.info("rewound to step %d for a new layout %s", step, self.layout())

    def _state_before(self, step: int) -> dict:
        snapshot = self._snapshots.latest(at_most=step)
        if snapshot is None:
            raise ValueError(f"no snapshot at or before step {step} in {self._dir}")
        return state_before(self._journal_path, snapshot[1], step)

    @property
    def replan_needed(self) -> bool:
        """Resumed on another layout, batch or mixture, or a skip of planned steps: re-plan from the resume step."""
        layout = self.journal_layout is not None and self.journal_layout != self.layout()
        batch = self.journal_batch is not None and self.journal_batch != self.batch
        return layout or batch or self.mixture_changed or self.skips_replan

    # -- mixture edits -----------------------------------------------------------------
    @property
    def mixture_changed(self) -> bool:
        """The config's mixture (sources, weights, loaders, strategy) is not the restored run's."""
        return self.journal_mixture is not None and self.journal_mixture != self.mixture

    def _config_edit(self, step: int) -> dict | None:
        """A resume on an edited config: from ``step`` on the config's mixture holds; the live
        reweightings of the run before it are superseded (the config was edited after them)."""
        if not self.mixture_changed:
            return None
        edit = {"step": step, "kind": "config", **describe_edit(self.journal_mixture, self.mixture),
                "weights": {name: s["weight"] for name, s in self.mixture["sources"].items()}}
        self.overrides.load_state_dict([])
        self.mixer.reset_credit()
        self.journal_mixture = self.mixture
        log.info("mixture edit at step %d: %s", step, edit)
        return edit

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()


def _mixer_state(state: dict, saved_sources: list[str] | None, sources: list[str]) -> dict:
    """The mixer's credits (kept per source position) for this config's sources: a dropped source's
    credit goes, an added one starts at 0."""
    if saved_sources is None or list(saved_sources) == list(sources):
        return state
    by_name = {key: dict(zip(saved_sources, state[key])) for key in ("credit", "realized")}
    return {key: [by_name[key].get(s, 0.0) for s in sources] for key in ("credit", "realized")}
