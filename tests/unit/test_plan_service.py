"""``planner/service.py``: ``PlanService`` over a real ``Planner`` whose loaders and other roles are
in-memory fakes of its ports (``planner/ports.py``): no process, no Flight. Registration starts
planning, trainer positions pace it, constructors get their constructor plans (several per answer, the same again
from the journal), a restarted constructor resumes where its ranks are, and a planning failure reaches
every waiting call."""
from __future__ import annotations

import time

import numpy as np
import pytest

from flight_overlord.config import parse_config
from flight_overlord.errors import BackgroundFailure, WaitTimedOut
from flight_overlord.planner import service as service_module
from flight_overlord.planner.planner import Planner
from flight_overlord.planner.service import PlanService
from flight_overlord.planner.strategy import load_strategy
from flight_overlord.wire.actions import PlanRequest, PositionsReport
from flight_overlord.wire.plan_channel import PLAN_AHEAD

PREFETCH = 1
CONSTRUCTORS = {0: "grpc://127.0.0.1:2", 1: "grpc://127.0.0.1:3"}
ROW_GROUPS = [["f.parquet", g, 50] for g in range(16)]


class FakeRoles:
    """``ports.RoleCalls`` in memory: which addresses answer, and the reshards announced."""

    def __init__(self):
        self.alive: set[str] = set()
        self.announced: list = []

    def answers(self, location: str) -> bool:
        return location in self.alive

    def announce(self, reshards) -> None:
        self.announced.append(reshards)


def _lengths(epoch, rg):
    return {"num_tokens": np.array([(37 * r + 11 * rg.row_group + epoch) % 200 + 8 for r in range(rg.num_rows)],
                                   dtype=np.int64)}


def _config(tmp_path):
    (tmp_path / "f.parquet").write_bytes(b"")  # the config only checks that the file exists
    return parse_config({
        "seed": 3, "run_dir": str(tmp_path / "run"), "data_root": str(tmp_path), "prefetch": PREFETCH,
        "sources": [{"name": "a", "paths": "f.parquet", "weight": 0.7},
                    {"name": "b", "paths": "f.parquet", "weight": 0.3}],
        "mesh": {"dp": 2}, "constructor": {"dp_per_constructor": 1},
        "global_batch": {"context_length": 512, "microbatches": 2, "samples_per_step": 12}}, base_dir=tmp_path)


@pytest.fixture
def built(tmp_path):
    """(service, roles, fetch): a Planner service with nothing registered yet; ``fetch`` is the loaders'
    metadata (replace ``fetch["meta"]`` to make it fail)."""
    cfg = _config(tmp_path)
    fetch = {"meta": _lengths}
    planner = Planner(cfg, load_strategy(cfg), lambda source: lambda epoch, rg: fetch["meta"](epoch, rg))
    planner.open(resume=False)
    roles = FakeRoles()
    service = PlanService(cfg, planner, roles, resumed=False, recover=False)
    yield service, roles, fetch
    service.stop()
    planner.close()


def _register_all(service: PlanService, constructors=CONSTRUCTORS) -> None:
    for source in ("a", "b"):
        service.register_loader(source, 0, 0, "grpc://127.0.0.1:1", ROW_GROUPS)
    for index, location in constructors.items():
        service.register_constructor(index, location)


def _planned_through(service: PlanService, step: int) -> None:
    """Until ``step`` is planned (bounded: a planning loop that stops short fails the test)."""
    deadline = time.monotonic() + 30
    while service.planner.next_step <= step and service.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert service.failure is None and service.planner.next_step > step


def test_registration_completes_and_planning_starts(built):
    service, _, _ = built
    service.register_loader("a", 0, 0, "grpc://127.0.0.1:1", ROW_GROUPS)
    assert not service.status().ready
    with pytest.raises(WaitTimedOut, match="the plan of step 0"):
        service.constructor_plan(0, 0, wait=0.2)
    _register_all(service)
    plans = service.constructor_plan(0, 0)
    assert service.status().ready and [p.plan().step for p in plans] == [0]
    assert plans[0].plan().keys


def _may_plan_next(service) -> bool:
    """Whether the planning thread may plan its next step now (its gate, not a race with the thread)."""
    with service.cond:
        return service._may_plan(service.planner.next_step)


def test_positions_pace_planning(built):
    service, _, _ = built
    _register_all(service)
    ahead = PREFETCH + PLAN_AHEAD  # steps planned past the slowest rank
    _planned_through(service, -1 + ahead)  # no rank said where it is yet: the slowest counts as at -1
    assert service.planner.next_step == ahead
    service.answer(PositionsReport(0, {0: 0}), 2)
    assert service.answer(PositionsReport(1, {1: 0}), 2) == {"ok": True}
    _planned_through(service, ahead)
    service.answer(PositionsReport(0, {0: 5}), 2)  # one rank moved on: the other still holds planning
    assert service.planner.next_step == ahead + 1 and not _may_plan_next(service)
    service.answer(PositionsReport(1, {1: 4}), 2)
    _planned_through(service, 4 + ahead)
    assert service.planner.next_step == 4 + ahead + 1 and not _may_plan_next(service)  # and no further
    assert service.status().requested == {"0": 5, "1": 4}


def test_plans_per_answer_and_the_same_plan_again_from_the_journal(built):
    service, _, _ = built
    _register_all(service)
    _planned_through(service, 1)
    both = service.answer(PlanRequest(0, 0), 2)
    assert [p.plan().step for p in both] == [0, 1]
    assert service.status().plan_answers == {"2": 1}
    other = service.answer(PlanRequest(0, 1), 1)  # every constructor took step 0: its plans are let go
    assert [p.plan().step for p in other] == [0]
    assert set(other[0].plan().keys).isdisjoint(both[0].plan().keys)
    again = service.constructor_plan(0, 0)[0]  # served again, re-derived from the journal
    assert again.header == both[0].header and again.rows.equals(both[0].rows)
    with pytest.raises(ValueError, match="beyond the planning horizon"):
        service.constructor_plan(10_000, 0)
    with pytest.raises(ValueError, match="constructor 7 out of range"):
        service.answer(PlanRequest(0, 7), 1)


def test_a_restarted_constructor_resumes_where_its_ranks_are(built, monkeypatch):
    service, _, _ = built
    monkeypatch.setattr(service_module, "WAIT_SECONDS", 0.3)  # a blocking call's server-side wait
    _register_all(service)
    assert service.resume_point(0) == 0  # a fresh run: no rank said anything yet
    assert service.stream_asked(0, 3) == (3, CONSTRUCTORS[0])
    service.answer(PositionsReport(0, {0: 6}), 1)  # its stream ran ahead of what reached the trainer
    service.register_constructor(0, CONSTRUCTORS[0])  # restarted on its own address: the report died with it
    assert service.status().reregistrations["constructor"] == 1
    with pytest.raises(WaitTimedOut, match="constructor 0 to say where they resume"):  # until its rank says so
        service.resume_point(0)
    service.stream_asked(0, 4)
    assert service.resume_point(0) == 4


def test_a_role_moves_only_when_its_old_address_is_gone(built):
    service, roles, _ = built
    _register_all(service)
    _planned_through(service, 0)
    roles.alive.add(CONSTRUCTORS[1])
    with pytest.raises(ValueError, match="still answers"):
        service.register_constructor(1, "grpc://127.0.0.1:9")
    roles.alive.clear()
    registrations = service.published_plans.registrations
    service.register_constructor(1, "grpc://127.0.0.1:9")
    assert service.published_plans.registrations == registrations + 1  # held plans named the old address
    assert service.constructor_location(1) == "grpc://127.0.0.1:9"
    assert service.constructor_plan(0, 1)[0].plan().step == 0  # from the journal


def test_a_planning_failure_reaches_every_waiting_call(built):
    service, _, fetch = built

    def broken(epoch, rg):
        raise OSError(f"row group {rg.row_group} unreadable")
    fetch["meta"] = broken
    _register_all(service)
    with pytest.raises(BackgroundFailure, match="planning failed"):
        service.constructor_plan(0, 0, wait=10)
    assert "unreadable" in service.status().error
