"""The harness every test, benchmark and ``scripts/stream_digest.py`` drives ranks and digests with:
a rank's error reaches the caller, digests see every value and nothing else, a plan hash needs
every step's plan."""
from __future__ import annotations

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


def test_plan_hash_follows_what_a_plan_serves_and_needs_every_step(tmp_path):
    first = harness.hash_plans([{"step": 0, "bins": [["a:0"]], "wall": 1.0},
                                {"step": 1, "bins": [["b:0"]], "state": 1}], 2)
    again = harness.hash_plans([{"step": 0, "bins": [["a:0"]], "wall": 9.0},
                                {"step": 1, "bins": [["b:0"]], "state": 2}], 2)
    assert again == first  # wall-clock fields and the journal's state do not count
    assert harness.hash_plans([{"step": 0, "bins": [["a:0"]]}, {"step": 1, "bins": [["c:0"]]}], 2) != first
    with pytest.raises(ValueError, match=r"plans of steps \[0, 1\], not 0..2"):
        harness.hash_plans([{"step": 0, "bins": [["a:0"]]}, {"step": 1, "bins": [["b:0"]]}], 3)
    # a path under the folder of a copy of the config: the copy's folder is left out
    elsewhere = tmp_path / "other"
    ours = harness.hash_plans([{"step": 0, "bins": [[str(tmp_path / "s.py")]]}], 1, root=tmp_path)
    theirs = harness.hash_plans([{"step": 0, "bins": [[str(elsewhere / "s.py")]]}], 1, root=elsewhere)
    assert ours == theirs != harness.hash_plans([{"step": 0, "bins": [[str(elsewhere / "s.py")]]}], 1)
