"""What the Planner role does between its Flight adapter and the planning logic (``Planner``),
without Flight: who registered where (and the rule for moving), the planning loop ahead of the
slowest trainer, trainer positions, a rewind on a new layout, and each constructor's plan of a
step. Its state is in a few objects with one job each: ``TrainerPositions`` (where each rank is),
``PublishedPlans`` (constructor plans until taken), ``PlanCounters`` (what status counts); what it
asks of other roles goes through ``ports.RoleCalls``.

One lock (``cond``) guards it; a blocking call waits on it server-side for at most ``WAIT_SECONDS``.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from .. import wire
from ..config import Config
from ..core.positions import TrainerPositions, checked_positions
from ..errors import BackgroundFailure, Busy, WaitTimedOut
from ..journal import write_json_atomic
from ..waiting import Waiters
from ..wire.actions import PlanRequest, PositionsReport
from ..wire.plan import EncodedPlan
from ..wire.plan_channel import PLAN_AHEAD
from ..wire.status import PlannerStatus
from .constructor_plans import constructor_plans
from .counters import PlanCounters
from .planner import Planner
from .ports import RoleCalls
from .published import PublishedPlans
from .reports import checked_report
from .roster import ROSTER_FILE

log = logging.getLogger(__name__)
WAIT_SECONDS = 30.0  # a blocking call waits this long server-side, then the client may ask again
STEPS_AHEAD = 16    # beyond prefetch: how far past the planned steps a trainer may ask before it is an error
# How long an answer waits for the next step's constructor plan when that step is being planned right now
# (about a planning's time at dp 64; past it, at thousands of ranks, the answer goes without it)
NEXT_PLAN_SECONDS = 0.05


class PlanService:
    def __init__(self, cfg: Config, planner: Planner, roles: RoleCalls, *, resumed: bool, recover: bool):
        """``roles``: whether a registered role still answers, and reshard announcements. ``resumed``: the
        run continues from its journal; ``recover``: also take the registrations in ``registry.json`` (a
        restart of the Planner alone)."""
        self.cfg = cfg
        self.planner = planner
        self.mesh = planner.mesh
        self.cond = threading.Condition()
        self.waiters = Waiters()  # this server's blocking calls, bounded
        # on the same lock: what a request waiting for a plan wakes on (a plan published, a failure, the
        # stop), not every position report, each of which wakes the planning thread
        self._published = threading.Condition(self.cond)
        self._roles = roles
        self._roster_file = cfg.run_dir / ROSTER_FILE
        self.resumed = resumed or recover
        if recover and self._roster_file.exists():
            registered = wire.decode(self._roster_file.read_bytes(), str(self._roster_file))
            self.planner.roster.load_state_dict(registered)
        self.rewind_pending = planner.replan_needed  # re-plan from the step the trainers resume at
        self.published_plans = PublishedPlans(self.mesh.num_constructors)
        self.positions = TrainerPositions()  # where each rank is (asked, or reported by its constructor)
        self.counters = PlanCounters()
        self.failure: BackgroundFailure | None = None  # planning failed: every waiting call gets it
        self.stopping = False
        self._started = False

    def start_if_complete(self) -> None:
        if self.planner.roster.complete():
            self._start_planning()

    # -- registration ------------------------------------------------------------------
    def register(self, role: str, location: str, name: str, current: str | None, add: Callable[[], None]) -> None:
        """Register ``role`` (named ``name``) at ``location`` by ``add()``; ``current``: its registered
        location, if any. A registered role moves only when its registered address no longer answers
        (recovery restarts a role on its own address), so not even a holder of the secret can
        redirect a live role."""
        if current is not None and current != location and self._roles.answers(current):
            raise ValueError(f"register: {name} is registered at {current}, which still answers; a registered role "
                             f"moves only when its address no longer answers (restart it on the same address)")
        with self.cond:
            add()
            if current != location:  # a new or moved role: its steps' plans are served from the journal (a
                self.published_plans.moved()  # restart on its own address, the recovery path, keeps them)
            if current is not None:
                self.counters.reregistrations[role] += 1
            if current is not None and current != location:
                log.warning("%s moved from %s (not answering) to %s", name, current, location)
            roster = self.planner.roster
            write_json_atomic(self._roster_file, roster.state_dict())
            self.cond.notify_all()  # trainers waiting for their constructor's location,
            self._published.notify_all()  # and requests for journaled steps, for every loader
            if roster.complete():
                self._start_planning()

    def register_loader(self, source: str, actor: int, replica: int, location: str, row_groups: list | str) -> None:
        """``row_groups``: the actor's, or the digest of its source's catalog, which the roster finds first
        here, outside the service's lock: it may ask the registering loader for it over the network."""
        source = self.cfg.source(source).name
        roster = self.planner.roster
        with self.cond:
            current = roster.loaders.get((source, actor), {}).get(replica)
            locations = roster.catalog_locations(source, location)
        if isinstance(row_groups, str) and roster.catalog_of is not None:
            roster.catalog_of(source, row_groups, locations)  # kept by the catalog cache for the roster's add
        self.register("loader", location, f"loader {source}[{actor}] replica {replica}", current,
                      lambda: roster.register_loader(source, actor, replica, location, row_groups))

    def register_constructor(self, index: int, location: str) -> None:
        roster = self.planner.roster
        with self.cond:
            current = roster.constructors.get(index)

        def add() -> None:
            roster.register_constructor(index, location)
            if current is not None:  # its streams' positions died with it: wait for the trainers to say
                self.positions.constructor_restarted(self.ranks_of(index))
        self.register("constructor", location, f"constructor {index}", current, add)

    def ranks_of(self, constructor: int) -> tuple[int, ...]:
        return self.mesh.ranks_of_constructor(constructor)

    def _start_planning(self) -> None:
        if not self._started:
            self._started = True
            self.planner.start_feeds()
            threading.Thread(target=self._plan_loop, name="planning", daemon=True).start()

    # -- planning ----------------------------------------------------------------------
    def _plan_loop(self) -> None:
        try:
            while True:
                with self.cond:
                    self.cond.wait_for(lambda: self.stopping or self._may_plan(self.planner.next_step))
                    if self.stopping:
                        return
                    self.published_plans.publishing = self.planner.next_step
                    registrations = self.published_plans.registrations
                plan = self.planner.plan_next()
                if self.planner.scaled:
                    self._roles.announce(self.planner.routes.reshards(self.planner.scaled))
                plans = constructor_plans(plan, self.mesh, self.planner.roster, self.planner.strategy.broadcast)
                with self.cond:
                    self.published_plans.publish(plan.step, plans, registrations)
                    self.counters.step_planned(plan)
                    self._published.notify_all()
        except Exception as exc:  # surface to every waiting client instead of hanging them
            log.exception("planning failed")
            with self.cond:
                self.failure = BackgroundFailure.of("planning failed", exc)
                self.cond.notify_all()
                self._published.notify_all()

    def _may_plan(self, step: int) -> bool:
        """Plan up to ``prefetch + PLAN_AHEAD`` steps past the slowest trainer that has asked for data,
        once the feedback a dynamic schedule reads is complete (and, on a new layout, once trainers
        said where they resume)."""
        slowest = self.positions.slowest()
        return (not self.rewind_pending and step <= slowest + self.cfg.prefetch + PLAN_AHEAD
                and self.planner.feedback_ready(step))

    def _check_horizon(self, step: int) -> None:
        """A step far past what is planned is a client's mistake (or abuse), answered at once rather
        than by holding a server thread until the client gives up."""
        horizon = max(self.planner.next_step, max(self.requested.values(), default=0)) + self.cfg.prefetch + STEPS_AHEAD
        if step > horizon and not self.rewind_pending:
            raise ValueError(f"step {step} is beyond the planning horizon: planned up to step "
                             f"{self.planner.next_step - 1}, trainers may ask at most {horizon}")

    def _wait_for_plan(self, step: int, timeout: float) -> None:
        """Until ``step`` is planned, and its constructor plans made (a constructor's ask then finds them), and
        every role registered (a restarted Planner re-derives journaled steps with the loaders' metadata)."""
        ready = lambda: self._published_step(step) and self.planner.roster.complete()  # noqa: E731
        self.waiters.wait_until(self._published, lambda: self.failure is not None or self.stopping or ready(),
                                timeout, f"the plan of step {step}")
        if self.failure:
            raise BackgroundFailure(str(self.failure), self.failure.cause)

    # -- trainers ----------------------------------------------------------------------
    def trainer_asks(self, step: int, rank: int) -> str:
        """Rank ``rank`` asks for ``step`` (which is how a trainer tells where it is): returns its
        constructor's location once the step is planned. The first ask after a resume on a new layout
        rewinds there."""
        with self.cond:
            if step < self.requested.get(rank, 0) and not self.rewind_pending:
                self.planner.check_rewind(rank, step)
            self._trainer_at(step, lambda: self.positions.asked(rank, step))
            self._wait_for_plan(step, WAIT_SECONDS)
            return self._constructor_of(rank)

    def stream_asked(self, rank: int, first: int | None) -> tuple[int, str]:
        """Rank ``rank`` asks for its stream from ``first`` (default: where it is), which is how it says
        where it (re)starts; after that its constructor reports its position, and the Planner is off
        its per-step path. Returns (first step, the location of the rank's constructor)."""
        with self.cond:
            known = self.requested.get(rank)
            first = (known or 0) if first is None else first
            if not self.rewind_pending and (known is None or first < known):  # a rank going on needs no check
                self.planner.check_rewind(rank, first)
            self._trainer_at(first, lambda: self.positions.asked(rank, first))
            return first, self._constructor_of(rank)

    def constructor_location(self, rank: int) -> str:
        """Where the rank's constructor is, once registered."""
        with self.cond:
            return self._constructor_of(rank)

    def rejoin_step(self, group: tuple[int, ...], served: dict[int, int]) -> int:
        """Where a replica group continues together (``TrainerPositions.rejoin_step``)."""
        with self.cond:
            return self.positions.rejoin_step(group, served)

    def source_loaders(self, source: str) -> tuple[int, list[tuple[tuple[str, int], list[str]]]]:
        """A source's rows (its registered row groups') and (actor, locations) of each of its loader actors."""
        roster = self.planner.roster
        with self.cond:
            rows = roster.source_row_groups(source).total_rows
            actors = [actor for actor in sorted(roster.loaders) if actor[0] == source]
            return rows, [(actor, roster.locations(actor)) for actor in actors]

    def _constructor_of(self, rank: int) -> str:
        """(Held lock.) Where the rank's constructor is, once registered (a restarted Planner answers first)."""
        index, constructors = self.mesh.constructor_of(self.mesh.coord(rank).dp), self.planner.roster.constructors
        self.waiters.wait_until(self.cond, lambda: index in constructors or self.stopping, WAIT_SECONDS,
                                f"constructor {index}")
        return constructors[index]

    def stream_starts(self) -> list[tuple[int, int, str]]:
        """(rank, the step it waits for, its constructor's location) of every rank whose constructor is
        registered: where a rank stream listed for inspection starts. Records nothing."""
        with self.cond:
            constructors = self.planner.roster.constructors
            located = ((r, constructors.get(self.mesh.constructor_of(self.mesh.coord(r).dp)))
                       for r in range(self.mesh.world_size))
            return [(r, self.requested.get(r, 0), where) for r, where in located if where is not None]

    def _trainer_at(self, step: int, record: Callable[[], None]) -> None:
        """A trainer said it waits for ``step`` (held lock): ``record()`` it; the first word of a trainer
        on a new layout says where re-planning starts."""
        self._check_horizon(step)
        record()
        if self.rewind_pending:
            self.rewind_pending = False
            self.planner.rewind(step)
        self.cond.notify_all()

    @property
    def requested(self) -> dict[int, int]:
        """rank -> the step it waits for (asked, or reported by its constructor's stream)."""
        return self.positions.requested

    def report(self, step: int, rank: int, losses: dict | None, body: dict | None = None) -> None:
        """A trainer's feedback on one step: per-source losses (one report per data-parallel group
        counts), ``compute_seconds`` / ``encoder_seconds`` (cost.fit: once per bucket) and ``waits``
        (its data waits, for status). Losses and timings are journaled before any plan reads them."""
        body = body or {}
        overall = checked_report(self.cfg, self.mesh, self.planner, step, rank, losses, body)
        waits = wire.field(body, "waits", dict, "report") if body.get("waits") is not None else None
        with self.cond:
            self.counters.trainer_reported(rank, step, waits, overall)
            changed = losses is not None and self.planner.report(step, rank, losses)
            for name, model in (("compute_seconds", "backbone"), ("encoder_seconds", "encoder")):
                if body.get(name) is not None:
                    changed = self.planner.report_compute(step, rank, body[name], model) or changed
            if changed:
                self.cond.notify_all()

    # -- constructors ------------------------------------------------------------------
    def answer(self, message: PlanRequest | PositionsReport, steps: int) -> list[EncodedPlan] | dict:
        """One message of a constructor's plans stream, or the ``plan`` action's body: a plan request gets
        the constructor's plans of its step and of the steps after it already planned, up to ``steps``
        (``constructor_plan``); a positions report ``{"ok": true}``."""
        if isinstance(message, PositionsReport):
            self.constructor_positions(message.constructor, message.positions)
            return {"ok": True}
        return self.constructor_plan(message.step, message.constructor, message.positions, message.wait, steps)

    def constructor_plan(self, step: int, constructor: int, positions: dict | None = None,
                         wait: float | None = None, steps: int = 1) -> list[EncodedPlan]:
        """Constructor ``constructor``'s plan of step ``step``, as the plans stream carries it, and of the
        steps after it already planned, up to ``steps`` steps in all (one being planned right now is
        waited for, briefly: ``_await_in_planning``). A step's constructor plans are held until every
        constructor took its own (``PublishedPlans``); later asks are served from the journal.
        ``positions``: {rank: step}, the next step each of its rank streams sends (how the Planner paces
        itself without a per-step call from those trainers). ``wait``: how long to hold the request at most
        (then ``WaitTimedOut``): the positions it brought may be what planning waits for once its streams
        moved on, so the constructor asks again with fresh ones."""
        self.constructor_positions(constructor, positions or {})
        with self.cond:
            self._check_horizon(step)
            self._wait_for_plan(step, min(WAIT_SECONDS, wait or WAIT_SECONDS))
            first = self.published_plans.take(step, constructor)
            following = []
            for later in range(step + 1, step + steps):
                self._await_in_planning(later)
                held = self.published_plans.take(later, constructor) if self._published_step(later) else None
                if held is None:
                    break
                following.append(held)
            if steps > 1:
                self.counters.answered(1 + len(following))
        if first is None:
            plan = self.planner.journaled(step)  # fetched by everyone before, or planned by an earlier Planner process
            if plan is None:
                raise KeyError(f"plan of step {step} is in no journal of this run")
            first = constructor_plans(plan, self.mesh, self.planner.roster, self.planner.strategy.broadcast,
                                      [constructor])[0]
        return [first, *following]

    def _await_in_planning(self, step: int) -> None:
        """(Held lock.) When ``step`` is the one being planned now, or the next and plannable (the positions
        just reported may be what let it), wait for it, at most ``NEXT_PLAN_SECONDS``: its constructor plan then comes
        along, and the constructor does not ask for it."""
        planning = step == self.published_plans.publishing or (step == self.planner.next_step and self._may_plan(step))
        if self._published_step(step) or not planning:
            return
        try:
            self.waiters.wait_until(self._published,
                                    lambda: self.failure is not None or self.stopping or self._published_step(step),
                                    NEXT_PLAN_SECONDS, f"the plan of step {step}")
        except (WaitTimedOut, Busy):
            pass  # planning takes longer than that (or the server is full of waiting calls): the answer goes without it

    def _published_step(self, step: int) -> bool:
        """(Held lock.) Planned, with its constructor plans made."""
        return step < self.planner.next_step and step != self.published_plans.publishing

    def constructor_positions(self, constructor: int, positions) -> None:
        """{rank: step}: the next step each rank stream of ``constructor`` sends (with a plan request, or
        reported alone while it waits for its trainers)."""
        self._check_constructor(constructor, "plan")
        positions = checked_positions(positions, constructor, self.ranks_of(constructor))
        with self.cond:
            if self.positions.reported(positions):  # the slowest moved (they only move forward), or a new rank
                self.cond.notify_all()

    def resume_point(self, constructor: int) -> int:
        """Where a (re)started constructor begins: the earliest step its ranks are waiting for."""
        self._check_constructor(constructor, "resume_point")
        ranks = self.ranks_of(constructor)
        with self.cond:  # a stream rank's reported position may be ahead of what reached its trainer
            self.waiters.wait_until(self.cond, lambda: self.positions.settled(ranks), WAIT_SECONDS,
                                    f"the stream ranks of constructor {constructor} to say where they resume")
            if not self.resumed and not all(r in self.requested for r in ranks):
                return min([self.requested.get(r, 0) for r in ranks])
            self.waiters.wait_until(self.cond, lambda: all(r in self.requested for r in ranks), WAIT_SECONDS,
                                    f"the ranks of constructor {constructor} to say where they resume")
            return min(self.requested[r] for r in ranks)

    def _check_constructor(self, constructor: int, what: str) -> None:
        if not 0 <= constructor < self.mesh.num_constructors:
            raise ValueError(f"{what}: constructor {constructor} out of range")

    # -- inspection --------------------------------------------------------------------
    def upcoming_steps(self) -> list[int]:
        """The planned steps still worth inspecting (the ones trainers are about to read)."""
        with self.cond:
            first = self.planner.next_step - self.cfg.prefetch - PLAN_AHEAD - 1
            return [s for s in sorted(self.counters.stats) if s >= first]

    def status(self) -> PlannerStatus:
        """Registration, planning progress, trainer positions, and where every role is."""
        with self.cond:
            roster = self.planner.roster
            unit = "tokens" if self.cfg.global_batch.tokens_per_step else "samples"
            return PlannerStatus(
                ready=roster.complete(), planned=self.planner.next_step - 1, world_size=self.mesh.world_size,
                requested={str(r): s for r, s in sorted(self.requested.items())},
                error=str(self.failure) if self.failure else None,
                recovered=self.resumed, **self.counters.status(unit), **roster.status(),
                scaling=self.planner.scaling.status() if self.planner.scaling is not None else None,
                cost=self.planner.cost_status(),
                mixture={"weights": self.planner.last_weights, "skips": self.planner.skips.state_dict(),
                         "pending": self.planner.overrides.pending(self.planner.next_step)})

    def step_stats(self, first: int, last: int | None) -> dict:
        """Per-step plan statistics of the steps in ``first..last`` still held (default: to the last planned)."""
        with self.cond:
            last = self.planner.next_step - 1 if last is None else last
            return self.counters.step_stats(first, last)

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
            self._published.notify_all()
