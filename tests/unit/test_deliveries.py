"""What constructors record as served (constructor/deliveries.py), for ``overlord audit``: no process.

Records written by ``DeliveryJournal`` read back by ``read_deliveries`` (deliveries apart from rewinds);
the keys' digest ignores their order; segments mark every start and resume; ``in_force`` keeps the
deliveries a trainer kept: the latest of a step served again, none a later resume rolled back.
"""
from __future__ import annotations

import json

import pytest

from flight_overlord.constructor.deliveries import (
    DIRECTORY,
    SEGMENTS,
    DeliveryJournal,
    in_force,
    keys_digest,
    mark_segment,
    read_deliveries,
)


@pytest.fixture
def clock(monkeypatch):
    """The records' ``t``, one tick per record: their order without reading the wall clock."""
    ticks = iter(range(1, 1000))
    monkeypatch.setattr("flight_overlord.constructor.deliveries.time.time", lambda: float(next(ticks)))


def record(t: float, step: int, rank: int, bucket: int = 0) -> dict:
    """A delivery record as ``read_deliveries`` returns it (the digest is not read by ``in_force``)."""
    return {"t": t, "step": step, "rank": rank, "bucket": bucket, "n": 1, "digest": ""}


def kept(starts: list[float], records: list[dict]) -> list[tuple[int, int, float, int]]:
    """(step, rank, t, segment) of every delivery in force."""
    return [(r["step"], r["rank"], r["t"], r["segment"]) for r in in_force(starts, records)]


def test_served_and_rewound_records_read_back_apart(tmp_path, clock):
    first, second = DeliveryJournal(tmp_path, 0), DeliveryJournal(tmp_path, 1)
    first.served(0, 0, 0, ["web:a", "qa:b"])      # t 1
    second.served(0, 2, 1, ["code:c"])           # t 2
    second.rewound(2, 0, 0)                      # t 3: rank 2 starts again at step 0
    first.rewound(0, 0, 0)                       # t 4
    second.served(0, 2, 1, ["code:c"])           # t 5
    first.close()
    second.close()
    assert sorted(p.name for p in (tmp_path / DIRECTORY).iterdir()) == ["constructor-0.jsonl", "constructor-1.jsonl"]
    starts, records, rewinds = read_deliveries(tmp_path)
    assert starts == []
    assert [(r["t"], r["step"], r["rank"], r["bucket"], r["n"], r["digest"]) for r in records] == [
        (1.0, 0, 0, 0, 2, keys_digest(["web:a", "qa:b"])),
        (2.0, 0, 2, 1, 1, keys_digest(["code:c"])), (5.0, 0, 2, 1, 1, keys_digest(["code:c"]))]
    # rewinds of every constructor, in time order; no keys recorded, only their digest
    assert [(r["rewind"], r["step"], r["served"]) for r in rewinds] == [(2, 0, 0), (0, 0, 0)]
    assert "web:a" not in (tmp_path / DIRECTORY / "constructor-0.jsonl").read_text()


def test_the_keys_digest_ignores_their_order_but_not_which_keys(tmp_path):
    """A constructor hook may reorder a bucket's microbatches: the audit compares the served keys'
    digest with that of the plan's keys, in plan order, given as a generator."""
    keys = ["web:f:0:1", "qa:f:0:2", "code:f:1:0"]
    assert keys_digest(keys) == keys_digest(reversed(keys)) == keys_digest(k for k in sorted(keys))
    assert keys_digest(keys) != keys_digest(keys[:2])
    assert keys_digest(keys) != keys_digest(keys + keys[:1])  # a key served twice is another delivery
    assert keys_digest(keys) != keys_digest(["web:f:0:1", "qa:f:0:2", "code:f:1:1"])
    journal = DeliveryJournal(tmp_path, 0)
    journal.served(4, 0, 0, list(reversed(keys)))
    journal.close()
    (served,) = read_deliveries(tmp_path)[1]
    planned = [(key, 0) for key in keys]  # the plan's (key, epoch) pairs, as the audit reads them
    assert served["digest"] == keys_digest(key for key, _epoch in planned)


def test_each_start_and_resume_marks_a_segment(tmp_path, clock):
    mark_segment(tmp_path, resume=False)  # t 1
    journal = DeliveryJournal(tmp_path, 0)
    journal.served(0, 0, 0, ["a"])        # t 2
    mark_segment(tmp_path, resume=True)   # t 3
    journal.served(0, 0, 0, ["a"])        # t 4
    journal.close()
    starts, records, _ = read_deliveries(tmp_path)
    assert starts == [1.0, 3.0]
    lines = (tmp_path / DIRECTORY / SEGMENTS).read_text().splitlines()
    assert [json.loads(line)["resume"] for line in lines] == [False, True]
    assert kept(starts, records) == [(0, 0, 4.0, 1)]  # the resumed run served step 0 again


def test_a_step_served_again_in_one_segment_counts_once_the_latest():
    records = [record(1, 0, 0), record(2, 0, 1), record(3, 1, 0), record(4, 0, 0), record(5, 1, 0)]
    assert kept([0.0], records) == [(0, 0, 4, 0), (0, 1, 2, 0), (1, 0, 5, 0)]
    assert kept([0.0], list(reversed(records))) == kept([0.0], records)  # by time, not by file order


def test_a_resume_rolls_back_every_earlier_delivery_from_its_first_step():
    """Segment 0 served steps 0..4 (rank 1 up to 4); the resumed run starts at step 3 and rank 1 has
    only reached 3 again: rank 1's step 4 of segment 0 was rolled back, not kept."""
    first = [record(1 + s, s, 0) for s in range(5)] + [record(1.5 + s, s, 1) for s in range(5)]
    resumed = [record(20, 3, 0), record(21, 3, 1), record(22, 4, 0)]
    assert kept([0.0, 10.0], first + resumed) == [
        (0, 0, 1, 0), (0, 1, 1.5, 0), (1, 0, 2, 0), (1, 1, 2.5, 0), (2, 0, 3, 0), (2, 1, 3.5, 0),
        (3, 0, 20, 1), (3, 1, 21, 1), (4, 0, 22, 1)]


def test_a_later_resume_further_back_rolls_back_every_segment_after_its_first_step():
    segment_0 = [record(1 + s, s, 0) for s in range(10)]
    segment_1 = [record(30, 6, 0), record(31, 7, 0)]  # resumed at step 6
    segment_2 = [record(50, 4, 0)]                    # resumed again, at step 4
    assert kept([0.0, 20.0, 40.0], segment_0 + segment_1 + segment_2) == [
        (0, 0, 1, 0), (1, 0, 2, 0), (2, 0, 3, 0), (3, 0, 4, 0), (4, 0, 50, 2)]


def test_a_segment_that_served_nothing_rolls_back_nothing():
    records = [record(1, 0, 0), record(2, 1, 0), record(20, 2, 0)]
    assert kept([0.0, 10.0, 15.0], records) == [(0, 0, 1, 0), (1, 0, 2, 0), (2, 0, 20, 2)]
    assert kept([], records) == [(0, 0, 1, 0), (1, 0, 2, 0), (2, 0, 20, 0)]  # no mark: one segment


def test_a_torn_last_line_is_skipped_and_the_next_record_reads_back(tmp_path, clock):
    """A constructor killed mid-write leaves half a record; its restart appends after it."""
    journal = DeliveryJournal(tmp_path, 0)
    journal.served(0, 0, 0, ["a"])
    journal.close()
    path = tmp_path / DIRECTORY / "constructor-0.jsonl"
    with path.open("ab") as f:
        f.write(b'{"t":2.0,"step":1,"ra')
    assert [r["step"] for r in read_deliveries(tmp_path)[1]] == [0]
    restarted = DeliveryJournal(tmp_path, 0)
    restarted.served(1, 0, 0, ["b"])
    restarted.close()
    _, records, _ = read_deliveries(tmp_path)
    assert [(r["step"], r["digest"]) for r in records] == [(0, keys_digest(["a"])), (1, keys_digest(["b"]))]
