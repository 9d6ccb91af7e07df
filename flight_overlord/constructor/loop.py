"""The constructor's assembly loop, without Flight: where to start, then step after step, paced on
its rank streams' positions, this constructor's plan of the step, every loader's samples for it
(concurrently, one call per loader process), the step's tables assembled and staged.

Its I/O is behind two small protocols, so the loop runs against in-memory fakes in a unit test:

- :class:`PlanSource`, the Planner: the step to resume at, a step's constructor plan (with the plans
  of the steps after it that came in the same answer), positions reports while assembly waits, and a
  released step's plan again (from the Planner's journal);
- :class:`SampleSource`, the loaders: one call for a list of fetch groups of one loader process.

Their Flight implementations are in ``flight_io.py``. A source that stops (its server shuts down)
answers None / False, and the loop ends; a source that raises fails assembly, and every waiting
take of the constructor gets that failure.
"""
from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Callable, Protocol

import pyarrow as pa

from ..config import Config
from ..core.starvation import fetch_shares
from ..wire.plan import ConstructorPlan, FetchGroup
from .assembly import Sample
from .fetched import fetch_groups, in_plan_order, received
from .staging import Staging

log = logging.getLogger(__name__)
Positions = Callable[[], dict[str, int]]  # the rank streams' positions, read afresh for each message
FETCH_WORKERS = 8  # loader processes called at once for one step


class PlanSource(Protocol):
    report_seconds: float  # while assembly waits for the streams, it reports their positions this often

    def resume_point(self) -> int | None:
        """The first step to assemble (0 on a fresh run, the trainers' position after a restart); None
        once stopping."""

    def plans_from(self, step: int, positions: Positions) -> list[ConstructorPlan] | None:
        """This constructor's plan of ``step``, then those of the steps after it planned already; the
        positions go with the ask (planning may wait for them). None once stopping."""

    def report(self, positions: Positions) -> bool:
        """The positions, reported while assembly waits for the streams; False once stopping."""

    def plan_again(self, step: int) -> ConstructorPlan | None:
        """A released step's constructor plan as the Planner serves it again (from its journal); None once stopping."""


class SampleSource(Protocol):
    def samples(self, step: int, groups: list[FetchGroup]) -> tuple[pa.Table, dict[str, float]]:
        """One loader process's samples of ``groups`` (their rows back to back) and the seconds it
        spent on them per source."""


class Assembler(Protocol):
    """What the loop drives: the :class:`~.constructor.Constructor` (its staging, pacing and assembly)."""
    index: int
    cfg: Config
    staging: Staging

    def begin_at(self, step: int) -> None: ...
    def paced(self, step: int, timeout: float | None = None) -> bool | None: ...
    def positions(self) -> dict[str, int]: ...
    def fetched(self, nbytes: int) -> None: ...
    def assemble(self, step: int, plan: ConstructorPlan, samples: dict) -> dict: ...
    def stage(self, step: int, tables: dict, stages: list[tuple] = ()) -> None: ...
    def fail(self, exc: BaseException) -> None: ...


class AssemblyLoop:
    def __init__(self, constructor: Assembler, plans: PlanSource, samples: SampleSource):
        self.constructor = constructor
        self.plans = plans
        self.samples = samples
        self._ahead: dict[int, ConstructorPlan] = {}  # constructor plans of later steps that came with an answer
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=FETCH_WORKERS, thread_name_prefix="fetch")

    def run(self) -> None:
        """Assemble from the resume point until the sources stop; a failure is handed to every take."""
        constructor = self.constructor
        try:
            start = self.plans.resume_point()
            if start is None:
                return
            constructor.begin_at(start)
            log.info("constructor %d assembles from step %d", constructor.index, start)
            while True:
                step = constructor.staging.next_step
                if not self._paced(step):
                    return
                asked = time.monotonic()
                plan = self._plan_of(step)
                if plan is None:
                    return
                planned = time.monotonic()
                samples, critical = self._fetch(step, plan)
                fetched = time.monotonic()
                tables = constructor.assemble(step, plan, samples)
                constructor.stage(step, tables, [(asked, planned, "plan", None), (planned, fetched, None, critical),
                                                 (fetched, time.monotonic(), "assembly", None)])
        except Exception as exc:
            log.exception("assembly failed")
            constructor.fail(exc)

    def assemble_again(self, step: int) -> dict:
        """A released step's tables built again, for a rank that went back to it: its plan as the Planner
        serves it again, its samples from the loaders (a released row group is read again), the same
        assembly: the same tables as the first time."""
        plan = self.plans.plan_again(step)
        if plan is None:
            raise RuntimeError(f"constructor {self.constructor.index} is stopping: ask the Planner for the "
                               f"stream again")
        samples, _ = self._fetch(step, plan)
        log.info("constructor %d: step %d assembled again for a rank that went back to it",
                 self.constructor.index, step)
        return self.constructor.assemble(step, plan, samples)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _paced(self, step: int) -> bool:
        """``Constructor.paced``, reporting the streams' positions while it waits: the Planner then never
        waits long for a message from this constructor."""
        while True:
            paced = self.constructor.paced(step, timeout=self.plans.report_seconds)
            if paced is not None:
                return paced
            if not self.plans.report(self.constructor.positions):
                return False

    def _plan_of(self, step: int) -> ConstructorPlan | None:
        """This constructor's plan of ``step``: taken ahead with an earlier step's answer (a plan's samples
        never change once made; a loader that moved meanwhile is looked up again by the fetch, as for any
        plan), or asked for, together with the next steps' plans already planned; None once stopping."""
        self._ahead = {s: p for s, p in self._ahead.items() if s >= step}  # none behind is asked for again
        if step in self._ahead:
            return self._ahead.pop(step)
        plans = self.plans.plans_from(step, self.constructor.positions)
        if plans is None:
            return None
        self._ahead.update((p.step, p) for p in plans[1:])
        return plans[0]

    def _fetch(self, step: int, plan: ConstructorPlan) -> tuple[dict[int, Sample], dict[str, float]]:
        """Every loader's samples for this step, concurrently (one call per loader process), through the
        decode stage: item index -> sample (or the failure of its decode). With them, how the call that
        finished last spent its time (seconds per source at the loader, the rest network)."""
        calls_done: list[tuple[float, dict[str, float]]] = []  # (end, shares) of each loader call
        cfg = self.constructor.cfg

        def one(groups: list[FetchGroup]) -> list[dict]:
            start = time.monotonic()
            table, served = self.samples.samples(step, groups)
            end = time.monotonic()
            calls_done.append((end, fetch_shares(end - start, served)))
            samples = received(cfg, step, plan, groups, table)
            self.constructor.fetched(table.nbytes)
            return samples

        calls = fetch_groups(plan)
        samples = in_plan_order(plan, calls, list(self._pool.map(one, calls)))
        return samples, max(calls_done, key=lambda c: c[0], default=(0.0, {}))[1]
