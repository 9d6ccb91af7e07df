"""The harness every test, benchmark and ``scripts/stream_digest.py`` drives ranks and digests with:
a rank's error reaches the caller, digests see every value and nothing else, a plan hash needs
every step's plan."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from flight_overlord import harness


def _table(keys, ids) -> pa.Table:
    return pa.table({"sample_keys": pa.array([keys], pa.list_(pa.string())),
                     "input_ids": pa.array([ids], pa.list_(pa.int32()))})


def test_each_rank_runs_every_rank_at_once_and_raises_a_ranks_error():
    seen = []
    harness.each_rank(seen.append, 4)
    assert sorted(seen) == [0, 1, 2, 3]

    def fail_on_two(rank):
        if rank == 2:
            raise RuntimeError("rank two broke")
    with pytest.raises(RuntimeError, match="rank two broke"):
        harness.each_rank(fail_on_two, 3)
    running = harness.RankThreads(fail_on_two, 3)
    running.join(raise_error=False)
    assert running.errors == ["rank 2: RuntimeError: rank two broke"]


def test_digests_follow_the_values_not_the_chunking():
    one = _table(["a:0", "b:1"], [1, 2, 3])
    chunked = pa.concat_tables([one.slice(0, 0), one])
    assert harness.step_digest(one) == harness.step_digest(chunked)
    assert harness.table_digest(one) == harness.table_digest(chunked)
    other = _table(["a:0", "b:1"], [1, 2, 4])  # one token differs
    assert harness.step_digest(one) != harness.step_digest(other)
    assert harness.table_digest(one) != harness.table_digest(other)


def test_plan_hash_ignores_wall_clock_fields_and_needs_every_step(tmp_path):
    def write(records):
        (tmp_path / "plan-journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write([{"step": 0, "bins": [["a:0"]], "wall": 1.0}, {"step": 1, "bins": [["b:0"]], "plan_time": 0.2}])
    first = harness.plan_hash(tmp_path, 2)
    write([{"step": 0, "bins": [["a:0"]], "wall": 9.0}, {"step": 1, "bins": [["b:0"]], "plan_time": 0.7}])
    assert harness.plan_hash(tmp_path, 2) == first
    write([{"step": 0, "bins": [["a:0"]]}, {"step": 1, "bins": [["c:0"]]}])
    assert harness.plan_hash(tmp_path, 2) != first
    with pytest.raises(ValueError, match=r"plans of steps \[0, 1\], not 0..2"):
        harness.plan_hash(tmp_path, 3)
    # a strategy journaled by the path of a copy of the config: the copy's folder is left out
    write([{"step": 0, "bins": [["a:0"]], "strategy": [str(tmp_path / "strategies" / "s.py")]}])
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    (elsewhere / "plan-journal.jsonl").write_text(json.dumps(
        {"step": 0, "bins": [["a:0"]], "strategy": [str(elsewhere / "strategies" / "s.py")]}) + "\n")
    assert harness.plan_hash(tmp_path, 1, root=tmp_path) == harness.plan_hash(elsewhere, 1, root=elsewhere)
    assert harness.plan_hash(tmp_path, 1) != harness.plan_hash(elsewhere, 1)
