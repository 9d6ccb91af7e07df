"""Every stateful class saves and restores its state as plain data, and a restored object behaves
exactly like the original from there on (the torchdata ``nodes`` discipline)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from flight_overlord.client import TrainerClient
from flight_overlord.config import parse_config
from flight_overlord.core.mixing import Mixer
from flight_overlord.core.order import RowGroupRef
from flight_overlord.planner.feed import SourceFeed
from flight_overlord.planner.planner import Planner
from flight_overlord.planner.roster import Roster
from flight_overlord.planner.strategy import load_strategy

from ..helpers import assert_round_trip

CATALOG = [RowGroupRef(f"f{f}.parquet", g, 7 + g) for f in range(2) for g in range(3)]
FULL = {"num_tokens": np.arange(1, 101, dtype=np.int64)}


def test_mixer():
    weights = {"a": 0.6, "b": 0.4}

    def advance(m):
        m.charge(m.choose(weights), 3, weights)
    mixer = Mixer(["a", "b"])
    for _ in range(5):
        advance(mixer)
    assert_round_trip(mixer, lambda: Mixer(["a", "b"]), advance)


def test_source_feed():
    def fresh():
        return SourceFeed("s", CATALOG, 3, lambda epoch, rg: FULL)
    feed = fresh()
    drawn = [feed.next() for _ in range(25)]
    feed.defer(drawn[-2:])
    assert_round_trip(feed, fresh, lambda f: f.next())


def _config(tmp_path, run: str = "run", **sections):
    raw = {"seed": 1, "run_dir": str(tmp_path / run), "data_root": str(tmp_path),
           "sources": [{"name": "s", "paths": "f.parquet"}], "mesh": {"dp": 2},
           "global_batch": {"context_length": 64, "microbatches": 2, "samples_per_step": 6}, **sections}
    (tmp_path / "f.parquet").write_bytes(b"")  # the config only checks that the file exists
    return parse_config(raw, base_dir=tmp_path)


def _planner(cfg, *, resume: bool) -> Planner:
    """A Planner over a fake loader (four row groups of nine 10-token samples), no server."""
    planner = Planner(cfg, load_strategy(cfg), lambda source: lambda epoch, rg: {
        "num_tokens": np.full(rg.num_rows, 10, dtype=np.int64)})
    planner.open(resume=resume)
    planner.roster.register_loader("s", 0, 0, "grpc://127.0.0.1:1", [["f.parquet", g, 9] for g in range(4)])
    planner.start_feeds()
    return planner


def test_roster(tmp_path):
    cfg = _config(tmp_path)
    roster = Roster(cfg, 2)
    roster.register_loader("s", 0, 0, "grpc://127.0.0.1:1", [["f.parquet", 0, 7]])
    roster.register_constructor(1, "grpc://127.0.0.1:2")
    restored = Roster(cfg, 2)
    restored.load_state_dict(json.loads(json.dumps(roster.state_dict())))
    assert restored.state_dict() == roster.state_dict()
    assert restored.locations(("s", 0)) == ["grpc://127.0.0.1:1"]


def test_planner_state_and_journal_restore(tmp_path):
    """A second Planner over the same run_dir restores at the end of the journal, serves the journaled
    steps as they were, and plans the next ones exactly as an uninterrupted Planner does."""
    first = _planner(_config(tmp_path), resume=False)
    plans = [first.plan_next().to_record() for _ in range(7)]
    first.close()
    second = _planner(_config(tmp_path), resume=True)
    assert second.next_step == 7
    assert [second.journaled(s).to_record() for s in range(7)] == plans
    ahead = [second.plan_next().to_record() for _ in range(3)]
    second.close()
    straight = _planner(_config(tmp_path, run="straight"), resume=False)
    assert [straight.plan_next().to_record() for _ in range(10)] == plans + ahead
    straight.close()


def test_step_records_lost_in_an_os_crash_are_planned_again_the_same(tmp_path, monkeypatch):
    """Step records are not fsync'd one by one (they are derived): an OS crash may lose the journal past
    its last fsync, and a restarted Planner then plans those steps again, exactly as they were."""
    import os
    synced = []  # (file, its size) at every fsync: what an OS crash keeps
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (real_fsync(fd), synced.append((os.fstat(fd).st_ino,
                                                                               os.fstat(fd).st_size))))
    first = _planner(_config(tmp_path, checkpoint={"every": 3}), resume=False)
    plans = [first.plan_next().to_record() for _ in range(8)]
    first.close()
    journal = tmp_path / "run" / "plan-journal.jsonl"
    kept = max(size for inode, size in synced if inode == journal.stat().st_ino)
    assert kept < journal.stat().st_size  # the last steps were not fsync'd: the crash below loses them
    os.truncate(journal, kept)
    second = _planner(_config(tmp_path, checkpoint={"every": 3}), resume=True)
    restart = second.next_step
    assert restart == 6  # from the snapshot at step 6, which made the steps before it durable
    assert [second.journaled(s).to_record() for s in range(restart)] == plans[:restart]
    assert [second.plan_next().to_record() for _ in range(restart, 8)] == plans[restart:]
    second.close()


def test_a_report_journaled_while_a_snapshot_is_taken_is_restored(tmp_path):
    """A trainer's report is journaled by a serving thread while ``plan_next`` snapshots (not under one
    lock): one landing between the state and the offset must be in the snapshot or in the tail after it."""
    first = _planner(_config(tmp_path), resume=False)
    taken = first.state_dict

    def state_dict_then_a_report():
        state = taken()
        assert first.report(0, 1, {"loss": 2.5})  # arrives right after the state was taken
        return state
    first.state_dict = state_dict_then_a_report
    first.plan_next()  # step 0: a snapshot
    reports = json.loads(json.dumps(first.feedback.reports))
    first.close()
    second = _planner(_config(tmp_path), resume=True)
    assert second.next_step == 1 and reports and json.loads(json.dumps(second.feedback.reports)) == reports
    second.close()


def test_planner_state_dict(tmp_path):
    planner = _planner(_config(tmp_path), resume=False)
    for _ in range(3):
        planner.plan_next()
    assert_round_trip(planner, lambda: _planner(_config(tmp_path, run="other"), resume=False),
                      lambda p: p.plan_next())


@pytest.mark.parametrize("next_step", [0, 41])
def test_trainer_client(next_step):
    client = TrainerClient("grpc://127.0.0.1:1", rank=3)
    client.load_state_dict({"rank": 3, "next_step": next_step})
    assert client.state_dict() == {"rank": 3, "next_step": next_step}
    client.close()


def test_snapshots_are_pruned_but_every_step_keeps_one_not_far_before(tmp_path):
    from flight_overlord.journal import Snapshots
    snapshots = Snapshots(tmp_path, "p", keep=3, bucket=100)
    for step in range(0, 2000, 10):
        snapshots.write(step, {"step": step})
    kept = snapshots.steps()
    assert len(kept) < 30 and kept[-3:] == [1970, 1980, 1990]
    for step in range(0, 2000, 7):  # a resume anywhere finds a snapshot at most one bucket back
        found, state = snapshots.latest(at_most=step)
        assert step - found < 100 + 10 and state == {"step": found}
