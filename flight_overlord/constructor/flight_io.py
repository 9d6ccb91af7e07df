"""The Flight side of a constructor's assembly loop (``loop.py``): its plan source is the Planner
(``resume_point`` and ``plan`` actions, and the plans stream, ``wire/plan_channel.py``), its sample
source the loaders (``do_get`` of a samples ticket, riding out a loader's restart or failing over to
its shadow). Both ask through a Planner restart, and answer None / False once their server stops;
a constructor that was replaced (``fence.py``) asks for no more plans or samples.
"""
from __future__ import annotations

import json
from typing import Callable

import pyarrow as pa

from .. import wire
from ..config import Config
from ..wire.actions import PlanRequest, PositionsReport, ResumePointRequest
from ..wire.plan import ConstructorPlan, FetchGroup
from ..wire.plan_channel import POSITIONS_SECONDS, PlanChannel
from ..wire.server import ClientPool, ask_again, call_any, within
from ..wire.tickets import SamplesPart, SamplesTicket
from .loader_addresses import LoaderAddresses
from .loop import Positions


class FlightPlanSource:
    """A ``PlanSource`` over the Planner's Flight calls."""

    report_seconds = POSITIONS_SECONDS

    def __init__(self, cfg: Config, index: int, clients: ClientPool, planner: str, *,
                 stopping: Callable[[], bool], check_fence: Callable[[], None]):
        self.cfg = cfg
        self.index = index
        self._clients = clients
        self._planner = planner
        self._stopping = stopping
        self._check_fence = check_fence
        self._channel = PlanChannel()  # plan requests as messages on one stream, not one call each

    def resume_point(self) -> int | None:
        answer = self._call("resume_point", lambda: ResumePointRequest(self.index).to_wire())
        return None if answer is None else answer["step"]

    def plans_from(self, step: int, positions: Positions) -> list[ConstructorPlan] | None:
        return self._call(None, lambda: PlanRequest(step, self.index, positions(), POSITIONS_SECONDS).to_wire())

    def report(self, positions: Positions) -> bool:
        return self._call(None, lambda: PositionsReport(self.index, positions()).to_wire()) is not None

    def plan_again(self, step: int) -> ConstructorPlan | None:
        raw = self._call("plan", lambda: PlanRequest(step, self.index).to_wire())
        return None if raw is None else ConstructorPlan.from_wire(raw)

    def close(self) -> None:
        self._channel.close(final=True)  # else the Planner's handler of it holds the Planner's shutdown

    def _call(self, action: str | None, body: Callable[[], dict]):
        """A blocking Planner action (None: a message on the plans stream), its body made afresh for each
        try: again while it times out (trainers have not moved on yet), and through a Planner restart;
        None once the server stops."""
        self._check_fence()

        def one(client):
            if action is None:
                return self._channel.ask(client, body())
            return wire.call(client, action, body(), timeout=self.cfg.liveness.call_seconds)
        try:
            return ask_again(lambda: call_any(self._clients, [self._planner], one, what="planner",
                                              stop=self._stopping), stop=self._stopping)
        except Exception:
            if self._stopping():
                return None
            raise


class FlightSampleSource:
    """A ``SampleSource`` over the loaders' ``do_get``: a hung loader's fetch goes to its shadow (or is
    asked again) after ``liveness.fetch_seconds``; a loader that moved is looked up at the Planner."""

    def __init__(self, cfg: Config, index: int, clients: ClientPool, planner: str, *,
                 stopping: Callable[[], bool], check_fence: Callable[[], None]):
        self.index = index
        self._deadline = cfg.liveness.fetch_seconds
        self._clients = clients
        self._loaders = LoaderAddresses(clients, planner)
        self._stopping = stopping
        self._check_fence = check_fence

    def samples(self, step: int, groups: list[FetchGroup]) -> tuple[pa.Table, dict[str, float]]:
        self._check_fence()
        parts = tuple(SamplesPart(g.source, g.actor, tuple(map(tuple, g.samples))) for g in groups)
        request = wire.ticket(SamplesTicket(step, self.index, parts).to_wire())
        table = call_any(self._clients, self._loaders.of(groups[0]),
                         lambda c: within(self._deadline, lambda options: c.do_get(request, options).read_all()),
                         what=f"the loader of {', '.join(sorted({g.source for g in groups}))}", stop=self._stopping)
        return table, json.loads((table.schema.metadata or {}).get(b"serve_seconds", b"{}"))
