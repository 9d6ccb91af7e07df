"""The run's own schedule without servers: ``overlord skip`` (the samples a window of steps would have
had are dropped and the stream moves on by the window; the same steps come out of a live skip, of the
config's ``skip:`` and of a replay of the journal), a batch ramp and context stages planned per step,
and a rewind onto another shape that delivers nothing twice and loses nothing planned."""
from __future__ import annotations

import pytest

from flight_overlord.config import ConfigError, parse_config
from flight_overlord.core.skips import parse_window

from .test_replay import _config_raw, _planner


def keys(plan) -> list[str]:
    return [p.ref.key for b in plan.bins for p in b]


def test_a_skipped_windows_samples_are_dropped_and_the_stream_moves_on_by_the_window(tmp_path):
    plain = _planner(parse_config(_config_raw(tmp_path, run="plain"), base_dir=tmp_path), resume=False)
    reference = [keys(plain.plan_next()) for _ in range(10)]
    plain.close()
    live = _planner(parse_config(_config_raw(tmp_path, run="live"), base_dir=tmp_path), resume=False)
    plans = [live.plan_next() for _ in range(3)]
    with pytest.raises(ValueError, match="step 2 is already planned"):
        live.skip(2, 4)
    assert live.skip(4, 5)["added"] and not live.skip(4, 5)["added"]
    plans += [live.plan_next() for _ in range(5)]
    live.close()
    # steps 4 and 5 would have had reference[4] and reference[5]: dropped; step 4 holds what step 6 would
    assert [keys(p) for p in plans] == reference[:4] + reference[6:10]
    assert [k for k, _ in plans[4].dropped] == reference[4] + reference[5] and not plans[5].dropped
    assert plans[4].stats["dropped"] == len(plans[4].dropped) and plans[4].stats["dropped_steps"] == [4, 5]

    # the config's skip: gives the same plans; a restarted Planner re-derives them, dropped samples included
    raw = {**_config_raw(tmp_path, run="config"), "skip": ["4:5"]}
    configured = _planner(parse_config(raw, base_dir=tmp_path), resume=False)
    assert [configured.plan_next().to_record() for _ in range(8)] == [p.to_record() for p in plans]
    configured.close()
    again = _planner(parse_config(raw, base_dir=tmp_path), resume=True)
    assert again.skips.windows == [[4, 5, 4]] and not again.replan_needed
    assert [(again.journaled(s).dropped, keys(again.journaled(s))) for s in (5, 4, 6)] == \
        [(plans[s].dropped, keys(plans[s])) for s in (5, 4, 6)]
    again.close()


@pytest.mark.parametrize("resume_at, dropped", [(3, [3, 4]), (4, [4]), (6, [])])
def test_a_window_the_config_adds_over_planned_steps_drops_from_where_trainers_resume(tmp_path, resume_at, dropped):
    """Steps 0-7 planned, the config adds a skip of 3-4 at a resume: the trainers' resume step decides
    which of the window's steps were delivered already (kept) and which are dropped."""
    first = _planner(parse_config(_config_raw(tmp_path), base_dir=tmp_path), resume=False)
    reference = [keys(first.plan_next()) for _ in range(8)]
    first.close()
    resumed = _planner(parse_config({**_config_raw(tmp_path), "skip": ["3:4"]}, base_dir=tmp_path), resume=True)
    assert resumed.replan_needed and resumed.skips.windows == [[3, 4, None]]
    resumed.rewind(resume_at)
    plans = [resumed.plan_next() for _ in range(2)]
    resumed.close()
    assert [k for k, _ in plans[0].dropped] == [k for s in dropped for k in reference[s]]
    assert [keys(p) for p in plans] == reference[resume_at + len(dropped):resume_at + len(dropped) + 2]


@pytest.mark.parametrize("value, message", [("4", None), (["3:1"], "skip\\[0\\]: 3:1 is no window"),
                                            (["a:b"], "skip\\[0\\]: 'a:b' is not FIRST:LAST"),
                                            ([[1, 2, 3]], "skip\\[0\\]: expected"), ("x", "skip: expected a list")])
def test_bad_skip_keys_are_named(tmp_path, value, message):
    raw = {**_config_raw(tmp_path), "skip": value}
    if message is None:
        value = [value]
        assert parse_config({**raw, "skip": value}, base_dir=tmp_path).skip == ((4, 4),)
        return
    with pytest.raises(ConfigError, match=message):
        parse_config(raw, base_dir=tmp_path)


def test_a_window_is_first_colon_last():
    assert parse_window("10:14", "w") == (10, 14) and parse_window("7", "w") == (7, 7)
    with pytest.raises(ValueError, match="w: -1:2 is no window"):
        parse_window("-1:2", "w")


def test_a_batch_ramp_and_a_context_stage_shape_each_step(tmp_path):
    """8 -> 32 samples per step over 40 steps; from step 20 sequences of 256 tokens, 3 microbatches per
    rank and the stage's own mixture; a restarted Planner re-derives the steps."""
    raw = {**_config_raw(tmp_path), "schedule": {
        "batch": {"ramp": {"from": 8, "to": 32, "start": 0, "end": 40}},
        "context": [{"from_step": 20, "context_length": 256, "microbatches": 3, "weights": {"b": 1.0}}]}}
    planner = _planner(parse_config(raw, base_dir=tmp_path), resume=False)
    plans = [planner.plan_next() for _ in range(24)]
    planner.close()
    drawn = [len(keys(p)) + p.stats["deferred"] for p in plans]
    assert drawn == [round(8 + 24 * s / 40) for s in range(24)]
    assert [(p.microbatches, p.capacity) for p in (plans[19], plans[20])] == [(2, 512), (3, 256)]
    assert all(len(p.bins) == 2 * 3 and max(sum(x.tokens for x in b) for b in p.bins) <= 256 for p in plans[20:])
    assert {k.split(":")[0] for p in plans[20:] for k in keys(p)} == {"b"}
    again = _planner(parse_config(raw, base_dir=tmp_path), resume=True)
    assert [keys(again.journaled(s)) for s in (5, 21)] == [keys(plans[5]), keys(plans[21])]
    again.close()
    with pytest.raises(ValueError, match=r"schedule.context\[0\] \(from step 3\): context_length 1024 is over"):
        from flight_overlord.planner.strategy import load_strategy
        stage = {"from_step": 3, "context_length": 1024}
        cfg = parse_config({**raw, "schedule": {"context": [stage]}}, base_dir=tmp_path)
        load_strategy(cfg)


def strategy_file_config(tmp_path) -> dict:
    """The schedules of ``test_a_batch_ramp_and_a_context_stage_shape_each_step`` in a strategy file."""
    (tmp_path / "shape.py").write_text(
        "from flight_overlord.orchestration import batch_ramp, context_stage\n"
        "def build(s):\n"
        "    return s.batch(batch_ramp(8, 32, start=0, end=40)).context(\n"
        "        context_stage(20, 256, microbatches=3, weights={'b': 1.0}))\n")
    return {**_config_raw(tmp_path, run="file"), "strategy": "shape.py"}


def test_a_strategy_file_programs_the_same_schedules_as_the_config(tmp_path):
    raw = {**_config_raw(tmp_path, run="yaml"), "schedule": {
        "batch": {"ramp": {"from": 8, "to": 32, "start": 0, "end": 40}},
        "context": [{"from_step": 20, "context_length": 256, "microbatches": 3, "weights": {"b": 1.0}}]}}
    plans = {}
    for name, config in (("yaml", raw), ("file", strategy_file_config(tmp_path))):
        planner = _planner(parse_config(config, base_dir=tmp_path), resume=False)
        plans[name] = [planner.plan_next().to_record() for _ in range(23)]
        assert planner.layout()["shape"]["context"] == [[20, 256, 3, {"b": 1.0}]]
        planner.close()
    assert plans["yaml"] == plans["file"]


@pytest.mark.parametrize("change", [
    {"global_batch": {"context_length": 256, "microbatches": 2, "samples_per_step": 12}},
    {"global_batch": {"context_length": 512, "microbatches": 4, "samples_per_step": 12}},
    {"global_batch": {"context_length": 512, "microbatches": 2, "samples_per_step": 7}},
                                    {"mesh": {"dp": 2, "cp": 2}}])
def test_a_rewind_onto_another_shape_delivers_nothing_twice_and_loses_nothing_planned(tmp_path, change):
    """Planned 10 steps, trainers resume at step 6 on another context length, microbatch count, global
    batch or cp size: steps 0-5 as delivered, then steps planned again from the state step 5 left. Every
    sample the old steps 6-9 had (planned, never delivered) comes in the new steps, none twice."""
    old = _planner(parse_config(_config_raw(tmp_path), base_dir=tmp_path), resume=False)
    first = [keys(old.plan_next()) for _ in range(10)]
    old.close()
    new = _planner(parse_config({**_config_raw(tmp_path), **change}, base_dir=tmp_path), resume=True)
    assert new.replan_needed
    new.rewind(6)
    again = [keys(new.plan_next()) for _ in range(12)]
    new.close()
    delivered = [k for step in first[:6] + again for k in step]
    assert len(delivered) == len(set(delivered))
    assert {k for step in first[6:] for k in step} <= set(delivered)
