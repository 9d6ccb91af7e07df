"""The Data Constructor's logic (constructor/constructor.py) without processes or Flight: a hand-made
plan, loader answers as the loaders send them, and what each rank is handed."""
from __future__ import annotations

import pytest

from flight_overlord.constructor.constructor import Constructor
from flight_overlord.errors import BackgroundFailure, OverlordError
from flight_overlord.planner.strategy import load_strategy

from .constructor_data import TOKENS, fetched, make_cfg, plan


@pytest.fixture
def cfg(tmp_path):
    return make_cfg(tmp_path)


@pytest.fixture
def constructor(cfg):
    return Constructor(cfg, 0, load_strategy(cfg))


def test_a_rank_gets_its_bucket_packed_in_plan_order(constructor):
    p = plan()
    constructor.stage(0, constructor.assemble(0, p, fetched(constructor.cfg, p)))
    table = constructor.take("batch", 0, 0)
    assert table.column("sample_keys").to_pylist() == [["a:0", "b:0"], ["c:0", "c:1"]]
    assert table.column("num_tokens").to_pylist() == [8, 5]
    assert table.column("cu_seqlens").to_pylist() == [[0, 5, 8], [0, 3, 5]]
    ids = table.column("input_ids").to_pylist()
    assert ids[0][:8] == TOKENS["a:0"] + TOKENS["b:0"] and ids[1][:5] == [9, 10, 11, 13, 14]
    status = constructor.status()
    assert status.served["0"] == {"step": 0, "batches": 1, "samples": 4, "bytes": table.nbytes}
    assert status.assembled == 0


def test_a_rank_of_another_constructor_is_refused(constructor):
    with pytest.raises(KeyError, match="rank 1 is not served by constructor 0"):
        constructor.take("batch", 0, 1)


def test_a_step_is_released_once_every_stream_is_past_it(constructor):
    keep = constructor.staging.keep  # 2 + prefetch: a reconnecting rank stream may ask again for steps in flight
    for step in range(keep + 2):
        p = plan(step)
        constructor.stage(step, constructor.assemble(step, p, fetched(constructor.cfg, p)))
        constructor.take("batch", step, 0)
    assert constructor.status().staged_steps == list(range(2, keep + 2))  # kept while within keep of the last served
    with pytest.raises(KeyError, match="already served and released"):
        constructor.take("batch", 0, 0)


def test_state_round_trips_and_restarts_assembly_where_it_was(cfg, constructor):
    p = plan()
    constructor.stage(0, constructor.assemble(0, p, fetched(constructor.cfg, p)))
    constructor.take("batch", 0, 0)
    state = constructor.state_dict()
    restored = Constructor(cfg, 0, load_strategy(cfg))
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    assert restored.staging.next_step == 1 and restored.status().staged_steps == []


def test_an_assembly_failure_reaches_every_taker(constructor):
    cause = ValueError("bad plan")
    constructor.fail(cause)
    with pytest.raises(BackgroundFailure, match="constructor 0: assembly failed: ValueError: bad plan") as err:
        constructor.take("batch", 0, 0)
    assert err.value.cause is cause and isinstance(err.value, OverlordError)
    assert constructor.status().error == "constructor 0: assembly failed: ValueError: bad plan"


def test_a_constructor_index_outside_the_mesh_is_refused(cfg):
    with pytest.raises(ValueError, match="constructor index 2 out of range"):
        Constructor(cfg, 2, load_strategy(cfg))

