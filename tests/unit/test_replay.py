"""The plan journal holds each step's inputs, state and digest, not its samples: a journaled step is
re-derived after a restart (checked against its digest), a changed input is an error naming the
step, and a record's size does not grow with the cluster."""
from __future__ import annotations

import json

import numpy as np
import pytest

from flight_overlord.config import parse_config
from flight_overlord.planner.planner import Planner
from flight_overlord.planner.replay import PlanMismatch
from flight_overlord.planner.strategy import load_strategy


def _config(tmp_path, *, dp: int = 2, run: str = "run", every: int = 5):
    raw = {"seed": 3, "run_dir": str(tmp_path / run), "data_root": str(tmp_path),
           "sources": [{"name": "a", "paths": "f.parquet", "weight": 0.7}, {"name": "b", "paths": "f.parquet", "weight": 0.3}],
           "mesh": {"dp": dp}, "checkpoint": {"every": every},
           "global_batch": {"context_length": 512, "microbatches": 2, "samples_per_step": 6 * dp}}
    (tmp_path / "f.parquet").write_bytes(b"")  # the config only checks that the file exists
    return parse_config(raw, base_dir=tmp_path)


def _lengths(shift: int = 0):
    def meta(epoch, rg):
        return {"num_tokens": np.array([(37 * r + 11 * rg.row_group + shift) % 200 + 8 for r in range(rg.num_rows)],
                                       dtype=np.int64)}
    return meta


def _planner(cfg, *, resume: bool, shift: int = 0) -> Planner:
    """A Planner over a fake loader per source (64 row groups of 50 samples), no server."""
    planner = Planner(cfg, load_strategy(cfg), lambda source: _lengths(shift))
    planner.open(resume=resume)
    for source in ("a", "b"):
        planner.registry.register_loader(source, 0, 0, "grpc://127.0.0.1:1", [["f.parquet", g, 50] for g in range(64)])
    planner.start_feeds()
    return planner


def test_a_restarted_planner_re_derives_every_journaled_step(tmp_path):
    first = _planner(_config(tmp_path), resume=False)
    plans = [first.plan_next().to_record() for _ in range(13)]
    first.close()
    journal = (tmp_path / "run" / "plan-journal.jsonl").read_text()
    assert "a:f.parquet" not in journal, "the journal holds sample keys"
    second = _planner(_config(tmp_path), resume=True)
    assert second.next_step == 13
    assert [second.journaled(s).to_record() for s in (12, 0, 6, 5, 9)] == [plans[s] for s in (12, 0, 6, 5, 9)]
    assert second.journaled(13) is None
    second.close()


def test_a_plan_that_comes_out_differently_is_an_error_naming_its_step(tmp_path):
    first = _planner(_config(tmp_path), resume=False)
    for _ in range(8):
        first.plan_next()
    first.close()
    changed = _planner(_config(tmp_path), resume=True, shift=1)  # the loaders now report other lengths
    with pytest.raises(PlanMismatch, match="step 6"):
        changed.journaled(6)
    changed.close()


def test_a_step_record_does_not_grow_with_the_cluster(tmp_path):
    sizes = {}
    for dp in (2, 64):
        planner = _planner(_config(tmp_path, dp=dp, run=f"dp{dp}"), resume=False)
        plans = [planner.plan_next() for _ in range(4)]
        planner.close()
        records = [json.loads(line) for line in (tmp_path / f"dp{dp}" / "plan-journal.jsonl").read_text().splitlines()]
        sizes[dp] = max(len(json.dumps(r)) for r in records if "digest" in r)
        whole = max(len(json.dumps(p.to_record())) for p in plans)
        assert sizes[dp] < whole or dp == 2
    assert sizes[64] < 2 * sizes[2], sizes  # 32x the samples per step, the same record


def test_the_journal_file_keeps_a_bounded_tail_and_old_steps_stay_servable(tmp_path):
    from flight_overlord.journal import archive_path, read_journal
    first = _planner(_config(tmp_path, every=5), resume=False)
    plans = [first.plan_next().to_record() for _ in range(20)]
    first.mix({"a": 0.2, "b": 0.8}, at=25)  # a live reweighting: its credit reset is a step's input
    plans += [first.plan_next().to_record() for _ in range(40)]
    first.close()
    path = tmp_path / "run" / "plan-journal.jsonl"
    in_file = [line for line in path.read_text().splitlines() if '"digest"' in line]
    assert archive_path(path).exists() and len(in_file) <= 5 * 2 * 4, len(in_file)  # snapshots kept x every, x2
    assert [r["step"] for _, r in read_journal(path) if "digest" in r] == list(range(60))  # archive + file
    assert [r["mix"]["step"] for _, r in read_journal(path) if "mix" in r] == [25]
    second = _planner(_config(tmp_path, every=5), resume=True)
    assert second.next_step == 60
    assert [second.journaled(s).to_record() for s in (2, 25, 33, 59)] == [plans[s] for s in (2, 25, 33, 59)]
    ahead = [second.plan_next().to_record() for _ in range(2)]
    second.close()
    straight = _planner(_config(tmp_path, run="straight", every=5), resume=False)
    again = [straight.plan_next().to_record() for _ in range(20)]
    straight.mix({"a": 0.2, "b": 0.8}, at=25)
    assert again + [straight.plan_next().to_record() for _ in range(42)] == plans + ahead
    straight.close()


def test_a_compacted_journal_keeps_its_offsets_and_survives_a_crash_midway(tmp_path):
    from flight_overlord.journal import Journal, archive_path, journal_size, read_journal
    path = tmp_path / "j.jsonl"
    journal = Journal(path)
    ends = [journal.append({"n": n}) for n in range(10)]
    assert journal.compact(ends[5]) > 0 and journal.start == ends[5]
    ends.append(journal.append({"n": 10}))
    assert [e for e, _ in read_journal(path)] == ends and journal.size() == journal_size(path) == ends[-1]
    assert [r["n"] for _, r in read_journal(path, ends[2])] == list(range(3, 11))  # from the archive on
    assert [r["n"] for _, r in read_journal(path, ends[7])] == list(range(8, 11))
    journal.close()
    with archive_path(path).open("ab") as archive:  # a crash after the archive grew, before the file was replaced
        archive.write(b'{"n": 99}\n')
    again = Journal(path)
    assert again.size() == ends[-1] and [r["n"] for _, r in read_journal(path)] == list(range(11))
    again.compact(ends[8])  # cuts the archive back to where the file starts before appending to it
    assert [r["n"] for _, r in read_journal(path)] == list(range(11))
    again.close()


def test_one_pass_over_the_journal_gives_every_step_s_plan_in_force_and_names_a_mismatch(tmp_path):
    """``Replayer.in_force`` (what an audit reads): every journaled step's plan, as ``journaled(step)``
    serves it, from one pass over the journal across its snapshots and archive; a changed input is
    still an error naming the step."""
    first = _planner(_config(tmp_path, every=5), resume=False)
    plans = [first.plan_next().to_record() for _ in range(23)]
    first.close()
    second = _planner(_config(tmp_path, every=5), resume=True)
    assert [p.to_record() for p in second.replayer.in_force()] == plans
    assert [r["step"] for r in second.replayer.records()] == list(range(23))
    second.close()
    changed = _planner(_config(tmp_path, every=5), resume=True, shift=1)
    with pytest.raises(PlanMismatch, match="step 0"):
        next(changed.replayer.in_force())
    changed.close()


def test_a_run_input_file_is_parsed_again_only_when_it_was_rewritten(tmp_path):
    from flight_overlord.planner.run_inputs import JsonFile
    path = tmp_path / "inputs.json"
    inputs = JsonFile(path, [])
    assert inputs.read() == []
    inputs.write([[3, 10]])
    first = inputs.read()
    assert first == [[3, 10]] and inputs.read() is first  # not parsed again
    inputs.write([[3, 10], [7, 99]])  # a new file (written atomically)
    assert inputs.read() == [[3, 10], [7, 99]]
