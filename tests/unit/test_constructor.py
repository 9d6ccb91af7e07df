"""The Data Constructor's logic (constructor/constructor.py) without processes or Flight: a hand-made
plan, loader answers as the loaders send them, and what each rank is handed."""
from __future__ import annotations

import pyarrow as pa
import pytest

from flight_overlord.config import parse_config
from flight_overlord.constructor.constructor import Constructor
from flight_overlord.errors import BackgroundFailure, OverlordError
from flight_overlord.planner.strategy import load_strategy
from flight_overlord.wire.plan import ConstructorPlan, FetchGroup
from flight_overlord.wire.schemas import load_schema

HOST_AB, HOST_C = "grpc://127.0.0.1:1", "grpc://127.0.0.1:2"  # two loader processes (never called here)
TOKENS = {"a:0": [1, 2, 3, 4, 5], "b:0": [6, 7, 8], "c:0": [9, 10, 11, 12], "c:1": [13, 14]}


@pytest.fixture
def cfg(tmp_path):
    for name in "abc":
        (tmp_path / f"{name}.parquet").write_bytes(b"")
    return parse_config({"seed": 1, "run_dir": str(tmp_path / "run"), "data_root": str(tmp_path),
                         "sources": [{"name": n, "paths": f"{n}.parquet"} for n in "abc"], "mesh": {"dp": 2},
                         "global_batch": {"context_length": 16, "microbatches": 2, "tokens_per_step": 40}},
                        base_dir=tmp_path)


@pytest.fixture
def constructor(cfg):
    return Constructor(cfg, 0, load_strategy(cfg))


def plan(step: int = 0, lengths=(5, 3, 3, 2)) -> ConstructorPlan:
    """Bucket 0: microbatch 0 holds a:0 and b:0, microbatch 1 c:0 (cut to 3 tokens) and c:1. Sources
    a and b are served by one loader process, c by another."""
    keys = list(TOKENS)
    fetch = [FetchGroup("a", 0, [HOST_AB], [0], [[0, "a.parquet", 0, 0, 1]]),
             FetchGroup("c", 0, [HOST_C], [2, 3], [[0, "c.parquet", 0, 0, 1], [0, "c.parquet", 0, 1, 1]]),
             FetchGroup("b", 0, [HOST_AB], [1], [[0, "b.parquet", 0, 0, 1]])]
    return ConstructorPlan(step, "DP", [], 16, keys, list(lengths), {0: [[0, 1], [2, 3]]}, fetch)


def loader_answer(keys: list[str]) -> pa.Table:
    """A loader's samples table for ``keys`` (text: no images)."""
    return pa.table({"key": keys, "tokens": [TOKENS[k] for k in keys], "images": [[] for _ in keys],
                     "image_grids": [[] for _ in keys], "loss_mask": [[] for _ in keys]}, schema=load_schema("samples"))


def fetched(constructor: Constructor, p: ConstructorPlan) -> dict:
    calls = constructor.fetch_groups(p)
    answers = [constructor.received(p.step, p, groups, loader_answer([k for g in groups for k in
                                                                      (p.keys[i] for i in g.items)]))
               for groups in calls]
    return constructor.in_plan_order(p, calls, answers)


def test_one_call_per_loader_process_in_plan_order(constructor):
    calls = constructor.fetch_groups(plan())
    assert [[(g.source, g.actor) for g in groups] for groups in calls] == [[("a", 0), ("b", 0)], [("c", 0)]]
    samples = fetched(constructor, plan())
    assert list(samples) == [0, 2, 3, 1]  # the plan's fetch order, though a and b came back in one table
    assert {i: s.key for i, s in samples.items()} == dict(enumerate(TOKENS))


def test_a_sample_is_cut_to_its_planned_length(constructor):
    samples = fetched(constructor, plan())
    assert samples[2].tokens.tolist() == [9, 10, 11]
    assert samples[0].tokens.tolist() == TOKENS["a:0"]


def test_a_loader_answer_of_the_wrong_size_names_the_loader(constructor):
    p = plan()
    groups = constructor.fetch_groups(p)[1]
    with pytest.raises(RuntimeError, match=f"the loader at {HOST_C} returned 1 samples for 2 asked"):
        constructor.received(0, p, groups, loader_answer(["c:0"]))


def test_a_rank_gets_its_bucket_packed_in_plan_order(constructor):
    p = plan()
    constructor.stage(0, constructor.assemble(0, p, fetched(constructor, p)))
    table = constructor.take("batch", 0, 0)
    assert table.column("sample_keys").to_pylist() == [["a:0", "b:0"], ["c:0", "c:1"]]
    assert table.column("num_tokens").to_pylist() == [8, 5]
    assert table.column("cu_seqlens").to_pylist() == [[0, 5, 8], [0, 3, 5]]
    ids = table.column("input_ids").to_pylist()
    assert ids[0][:8] == TOKENS["a:0"] + TOKENS["b:0"] and ids[1][:5] == [9, 10, 11, 13, 14]
    status = constructor.status()
    assert status.served["0"] == {"step": 0, "batches": 1, "samples": 4, "bytes": table.nbytes}
    assert status.assembled == 0 and status.bytes_fetched > 0


def test_a_rank_of_another_constructor_is_refused(constructor):
    with pytest.raises(KeyError, match="rank 1 is not served by constructor 0"):
        constructor.take("batch", 0, 1)


def test_a_step_is_released_once_every_stream_is_past_it(constructor):
    keep = constructor.staging.keep  # 2 + prefetch: a reconnecting rank stream may ask again for steps in flight
    for step in range(keep + 2):
        p = plan(step)
        constructor.stage(step, constructor.assemble(step, p, fetched(constructor, p)))
        constructor.take("batch", step, 0)
    assert constructor.status().staged_steps == list(range(2, keep + 2))  # kept while within keep of the last served
    with pytest.raises(KeyError, match="already served and released"):
        constructor.take("batch", 0, 0)


def test_state_round_trips_and_restarts_assembly_where_it_was(cfg, constructor):
    p = plan()
    constructor.stage(0, constructor.assemble(0, p, fetched(constructor, p)))
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

