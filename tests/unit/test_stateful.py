"""The state contract (``flight_overlord/stateful.py``): every state-holding class of the roles is a
``Stateful``, and the ones built cheaply round-trip (the Planner's, the loader state's and the feed's
round-trips are in test_state.py, the staging's in test_staging.py, the constructor's in test_constructor.py)."""
from __future__ import annotations

import importlib
import inspect
import json

import pytest

from flight_overlord.client import TrainerClient
from flight_overlord.client.microbatches import MicrobatchView
from flight_overlord.core.costfit import CostFit
from flight_overlord.core.scaling import Scaler
from flight_overlord.core.skips import StepSkips
from flight_overlord.planner.edits import MixOverrides
from flight_overlord.stateful import Stateful

from ..helpers import assert_round_trip

# every class of the roles that keeps state across a restart or a checkpoint, by its module
ROLE_STATE = [
    ("flight_overlord.loader.state", "LoaderState"),
    ("flight_overlord.core.mixing", "Mixer"),
    ("flight_overlord.core.costfit", "CostFit"),
    ("flight_overlord.core.scaling", "Scaler"),
    ("flight_overlord.core.skips", "StepSkips"),
    ("flight_overlord.planner.planner", "Planner"),
    ("flight_overlord.planner.feed", "SourceFeed"),
    ("flight_overlord.planner.roster", "Roster"),
    ("flight_overlord.planner.scaling", "SourceScaling"),
    ("flight_overlord.planner.costing", "PlannedCost"),
    ("flight_overlord.planner.edits", "MixOverrides"),
    ("flight_overlord.constructor.constructor", "Constructor"),
    ("flight_overlord.constructor.staging", "Staging"),
    ("flight_overlord.client.trainer", "TrainerClient"),
    ("flight_overlord.client.microbatches", "MicrobatchView"),
]
# the framework adapters keep the trainer's position the same way (their frameworks are optional)
ADAPTERS = [
    ("flight_overlord.integrations.torchdata", "OverlordDataset"),
    ("flight_overlord.integrations.hf", "HFMicrobatches"),
    ("flight_overlord.integrations.lightning", "OverlordPosition"),
    ("flight_overlord.integrations.torchtitan", "OverlordDataLoader"),
]


@pytest.mark.parametrize("module, name", ROLE_STATE + ADAPTERS, ids=[n for _, n in ROLE_STATE + ADAPTERS])
def test_every_role_state_class_is_stateful(module, name):
    try:
        cls = getattr(importlib.import_module(module), name)
    except ImportError as exc:  # an adapter whose framework is not installed here
        pytest.skip(f"{module}: {exc}")
    assert issubclass(cls, Stateful)
    assert list(inspect.signature(cls.state_dict).parameters) == ["self"]
    assert len(inspect.signature(cls.load_state_dict).parameters) == 2  # self, state


def test_the_protocol_is_structural():
    class Counter:
        def state_dict(self) -> dict:
            return {}

    class Position(Counter):
        def load_state_dict(self, state: dict) -> None:
            pass
    assert not isinstance(Counter(), Stateful) and isinstance(Position(), Stateful)


def test_cost_fit():
    def fresh():
        return CostFit(1.0, 0.001, lag=2, window=4, buckets=2, max_per_step=4)

    def advance(fit):
        step = 1 + max(fit.reports, default=-1)
        for bucket in range(2):
            fit.add(step, bucket, [[100.0 * (bucket + 1), 10.0 * step, 0.1 + step], [50.0, 5.0, 0.05]])
        fit.forget_before(step)
    fit = fresh()
    for _ in range(5):
        advance(fit)
    assert_round_trip(fit, fresh, advance)
    assert fresh().fit_for(9) != fit.fit_for(9)  # the reports are what the fit is made of


def test_scaler():
    def fresh():
        return Scaler({"web": 1, "code": 1}, interval=2, up_threshold=0.6, down_threshold=0.2, consecutive=1,
                      max_actors=3)

    def advance(scaler):
        scaler.observe(0, {"web": 0.9, "code": 0.1})
    scaler = fresh()
    for _ in range(3):  # one interval past, one half-way: the running sums are state too
        advance(scaler)
    assert scaler.actors["web"] == 2
    assert_round_trip(scaler, fresh, advance)


def test_step_skips():
    skips = StepSkips()
    skips.add(4, 6, planned_to=2)
    skips.add(10, 12, planned_to=11)  # its first steps were planned: its start waits for the re-plan

    def advance(s):
        first = 2 * s.windows[-1][1]
        s.add(first, first + 5, planned_to=0)
    assert_round_trip(skips, StepSkips, advance)


def test_mix_overrides():
    overrides = MixOverrides()
    overrides.add(3, {"web": 0.7, "code": 0.3})
    assert_round_trip(overrides, MixOverrides,
                      lambda o: o.add(o.changes[-1][0] + 5, {"web": 0.5, "code": 0.5}))


def test_microbatch_view():
    client = TrainerClient("grpc://127.0.0.1:1", rank=2)  # not connected: the position is plain state
    view = MicrobatchView(client)
    view.load_state_dict({"rank": 2, "step": 7, "microbatch": 1})
    state = json.loads(json.dumps(view.state_dict()))
    restored = MicrobatchView(TrainerClient("grpc://127.0.0.1:1", rank=2))
    restored.load_state_dict(state)
    assert restored.state_dict() == state == {"rank": 2, "step": 7, "microbatch": 1}
    assert restored.client.state_dict() == {"rank": 2, "next_step": 7}
    for c in (client, restored.client):
        c.close()
