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


def _config_raw(tmp_path, *, dp: int = 2, run: str = "run", every: int = 5) -> dict:
    (tmp_path / "f.parquet").write_bytes(b"")  # the config only checks that the file exists
    return {"seed": 3, "run_dir": str(tmp_path / run), "data_root": str(tmp_path),
            "sources": [{"name": "a", "paths": "f.parquet", "weight": 0.7},
                        {"name": "b", "paths": "f.parquet", "weight": 0.3}],
            "mesh": {"dp": dp}, "checkpoint": {"every": every},
            "global_batch": {"context_length": 512, "microbatches": 2, "samples_per_step": 6 * dp}}


def _config(tmp_path, **options):
    return parse_config(_config_raw(tmp_path, **options), base_dir=tmp_path)


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
        planner.roster.register_loader(source, 0, 0, "grpc://127.0.0.1:1", [["f.parquet", g, 50] for g in range(64)])
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


def test_a_record_appended_after_a_torn_last_line_is_kept(tmp_path):
    """A crash mid-write leaves half a line; the journal reopened ends it, so the next record (a
    resumed Planner's first step) is a line of its own, not glued to the torn one and lost."""
    from flight_overlord.journal import Journal, journal_size, read_journal
    path = tmp_path / "j.jsonl"
    journal = Journal(path)
    journal.append({"n": 1})
    journal.close()
    with path.open("a") as f:
        f.write('{"step": 99999, "layout": {"bu')
    again = Journal(path)
    end = again.append({"n": 2})
    again.close()
    assert [r for _, r in read_journal(path)] == [{"n": 1}, {"n": 2}]
    assert end == journal_size(path) == [e for e, _ in read_journal(path)][-1]


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


class FlakyLoader:
    """The fake loaders of ``_planner`` whose reads of chosen row groups fail (every row -1, as a
    loader answers a row group it cannot read); ``die_after_failure``: the fetch after a failed one
    raises ``Killed``, as a Planner killed mid-step, its step never journaled."""

    def __init__(self):
        self.failing: set[tuple[str, int]] = set()  # (source, row group)
        self.die_after_failure = False
        self.fetched: list[tuple[str, int, bool]] = []  # (source, row group, read)

    def fetch(self, source: str):
        lengths = _lengths()

        def meta(epoch, rg):
            if self.fetched and not self.fetched[-1][2] and self.die_after_failure:
                raise Killed
            read = (source, rg.row_group) not in self.failing
            self.fetched.append((source, rg.row_group, read))
            tokens = lengths(epoch, rg)["num_tokens"] if read else np.full(rg.num_rows, -1, dtype=np.int64)
            return {"num_tokens": tokens, "image_patches": np.zeros(rg.num_rows, dtype=np.int64),
                    "image_sizes": [()] * rg.num_rows}  # as row_group_metadata gives a loader's answer
        return meta


class Killed(Exception):
    pass


def _flaky_planner(cfg, loader: FlakyLoader, *, resume: bool) -> Planner:
    planner = Planner(cfg, load_strategy(cfg), loader.fetch)
    planner.open(resume=resume)
    for source in ("a", "b"):
        planner.roster.register_loader(source, 0, 0, "grpc://127.0.0.1:1", [["f.parquet", g, 50] for g in range(64)])
    planner.start_feeds()
    return planner


def _all_journaled(cfg, loader: FlakyLoader) -> list[dict]:
    """Every journaled step re-derived by a restarted Planner, one by one and in one pass (the audit)."""
    planner = _flaky_planner(cfg, loader, resume=True)
    one_by_one = [planner.journaled(step).to_record() for step in range(planner.next_step)]
    assert [plan.to_record() for plan in planner.replayer.in_force()] == one_by_one
    planner.close()
    return one_by_one


def test_a_read_that_failed_only_before_a_kill_is_not_replayed_as_failed(tmp_path):
    """A row group fails to read, the Planner dies before that step is journaled; restarted, the read
    succeeds and the step is planned again: every journaled step re-derives (the failure held for no
    record), and the plans are those of a run where the read never failed."""
    cfg, loader = _config(tmp_path), FlakyLoader()
    first = _flaky_planner(cfg, loader, resume=False)
    plans = [first.plan_next().to_record() for _ in range(3)]
    fetched = len(loader.fetched)
    loader.failing, loader.die_after_failure = {("a", g) for g in range(64)} - {g for _, g, _ in loader.fetched}, True
    with pytest.raises(Killed):
        for _ in range(20):
            plans.append(first.plan_next().to_record())
    first.close()
    failed = [(s, g) for s, g, read in loader.fetched[fetched:] if not read]
    assert len(failed) == 1, loader.fetched[fetched:]
    loader.failing, loader.die_after_failure = set(), False  # the file is back
    second = _flaky_planner(cfg, loader, resume=True)
    plans += [second.plan_next().to_record() for _ in range(6)]
    second.close()
    assert any(k.startswith(f"a:f.parquet:{failed[0][1]}:") for p in plans for k in p["samples"])
    assert _all_journaled(cfg, loader) == plans
    straight = _flaky_planner(_config(tmp_path, run="straight"), FlakyLoader(), resume=False)
    assert [straight.plan_next().to_record() for _ in range(len(plans))] == plans
    straight.close()


def test_a_read_that_fails_only_after_a_restart_is_replayed_as_failed_only_there(tmp_path):
    """A row group read fine for the steps before a restart fails to read after it (the Planner
    restarts mid row group and reads it again): both kinds of step re-derive, once the file is back."""
    cfg, loader = _config(tmp_path), FlakyLoader()
    first = _flaky_planner(cfg, loader, resume=False)
    plans = [first.plan_next().to_record() for _ in range(4)]
    while first.feeds["a"].row_index == 0:  # stop with source a's cursor inside a row group
        plans.append(first.plan_next().to_record())
    unit = first.feeds["a"]._row_group()[0]  # a row group, or a window of them (sources[].shuffle_window)
    inside = {("a", rg.row_group) for rg in getattr(unit, "row_groups", [unit])}
    first.close()
    loader.failing = inside
    second = _flaky_planner(cfg, loader, resume=True)
    plans += [second.plan_next().to_record() for _ in range(4)]
    second.close()
    assert inside <= {(s, g) for s, g, read in loader.fetched if not read}
    assert second.feeds["a"].skipped > 0
    loader.failing = set()
    assert _all_journaled(cfg, loader) == plans


def test_an_unreadable_note_holds_from_the_failed_read_to_the_next_good_one(tmp_path):
    from flight_overlord.core.order import RowGroupRef
    from flight_overlord.planner.run_inputs import Unreadable
    path, rg, answers = tmp_path / "unreadable.json", RowGroupRef("f.parquet", 3, 4), []
    size = [100]
    watched = Unreadable(path).watched("a", lambda epoch, rg: answers.pop(0), lambda: size[0])
    for good, size[0] in ((False, 100), (False, 150), (True, 200), (True, 250), (False, 300), (True, 300)):
        answers.append({"num_tokens": np.full(4, 1 if good else -1)})
        watched(0, rg)

    def read(epoch, rg):
        return {"num_tokens": np.ones(4, dtype=np.int64)}

    for notes in (Unreadable(path), Unreadable(path)):  # as the file holds it
        failed = [o for o in (0, 99, 100, 150, 199, 200, 250, 300, 400)
                  if notes.applied("a", read, o)(0, rg)["num_tokens"][0] < 0]
        assert failed == [100, 150, 199]  # and a failure healed at the same offset held for no record
        assert notes.applied("a", read, 150)(1, rg)["num_tokens"][0] == 1  # another epoch: its own reads
    path.write_text('[["a", 0, "f.parquet", 3]]')  # a note written before notes were scoped: always
    assert Unreadable(path).applied("a", read, 10**9)(0, rg)["num_tokens"][0] == -1


def test_the_config_history_takes_this_start_s_yaml_when_it_starts(tmp_path):
    """A step planned by this start is re-derived with this start's config, even when the YAML was
    edited (for the next resume) before the first replay; a step of an earlier start with its own."""
    import yaml

    from flight_overlord.config import load_config
    from flight_overlord.planner.run_inputs import ConfigHistory
    raw = _config_raw(tmp_path)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    history = ConfigHistory(tmp_path / "configs.json", load_config(path))
    history.note(0)
    path.write_text(yaml.safe_dump({**raw, "seed": 4}))  # edited for a resume, this start goes on
    assert history.at(100) == (0, history.entries()[0], None)  # this start's: its own config and strategy
    resumed = ConfigHistory(tmp_path / "configs.json", load_config(path))
    resumed.note(500)
    index, entry, (cfg, _) = resumed.at(100)
    assert (index, entry["offset"], cfg.seed) == (0, 0, 3)
    assert resumed.at(500)[::2] == (1, None) and resumed.at(-1) == (-1, None, None)


def _fsyncs(monkeypatch) -> set[tuple[int, int]]:
    """(inode, size) of a file at every fsync of it: what an OS crash keeps of it."""
    import os
    synced, real_fsync = set(), os.fsync

    def fsync(fd):
        real_fsync(fd)
        synced.add((os.fstat(fd).st_ino, os.fstat(fd).st_size))
    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def _kept(path, synced) -> bool:
    return (path.stat().st_ino, path.stat().st_size) in synced


def test_an_unreadable_note_is_durable_at_an_offset_an_os_crash_keeps(tmp_path, monkeypatch):
    """Step records are not fsync'd one by one: a note of a failed read must name an offset the journal
    keeps after an OS crash (its size once synced), and be fsync'd itself before the step planned from
    it is journaled (that record may survive the crash)."""
    synced = _fsyncs(monkeypatch)
    cfg, loader = _config(tmp_path), FlakyLoader()
    planner = _flaky_planner(cfg, loader, resume=False)
    for _ in range(3):  # step 0 snapshots (a sync), steps 1 and 2 are journaled after it, not fsync'd
        planner.plan_next()
    loader.failing, loader.die_after_failure = {("a", g) for g in range(64)} - {g for _, g, _ in loader.fetched}, True
    with pytest.raises(Killed):  # at the fetch after the first failed one: its note is written by then
        for _ in range(20):
            planner.plan_next()
    planner.close()
    journal, notes = cfg.run_dir / "plan-journal.jsonl", cfg.run_dir / "planner" / "unreadable.json"
    opened = {entry[4] for entry in json.loads(notes.read_text())}
    assert opened and opened <= {size for inode, size in synced if inode == journal.stat().st_ino}
    assert _kept(notes, synced)


def test_a_start_s_config_is_noted_durably(tmp_path, monkeypatch):
    import yaml

    from flight_overlord.config import load_config
    from flight_overlord.planner.run_inputs import ConfigHistory
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_config_raw(tmp_path)))
    synced = _fsyncs(monkeypatch)
    ConfigHistory(tmp_path / "configs.json", load_config(path)).note(0)
    assert _kept(tmp_path / "configs.json", synced)


def test_the_config_of_a_record_is_the_last_noted_at_or_before_it_whatever_the_order(tmp_path):
    """After an OS crash a later start may note a smaller offset than an earlier start (the journal lost
    its unsynced tail): the config of a record is the last entry (by position) noted at or before it."""
    import yaml

    from flight_overlord.config import load_config
    from flight_overlord.planner.run_inputs import ConfigHistory
    raw = _config_raw(tmp_path)
    path = tmp_path / "run.yaml"
    for seed, offset in ((3, 0), (4, 500), (5, 300)):  # the start at 500 lost its tail: the next noted 300
        path.write_text(yaml.safe_dump({**raw, "seed": seed}))
        ConfigHistory(tmp_path / "configs.json", load_config(path)).note(offset)
    path.write_text(yaml.safe_dump({**raw, "seed": 6}))
    history = ConfigHistory(tmp_path / "configs.json", load_config(path))
    seeds = {o: (history.at(o)[0], history.at(o)[2][0].seed) for o in (0, 299, 300, 499, 500, 900)}
    assert seeds == {0: (0, 3), 299: (0, 3), 300: (2, 5), 499: (2, 5), 500: (2, 5), 900: (2, 5)}
