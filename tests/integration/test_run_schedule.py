"""The training run's own schedule (issue 33) on real servers, each with a kill -9 of every role and a
resume: a batch ramp with a context stage, skipped steps, a resume on another shape. Every rank's
stream is compared with an undisturbed run, and ``overlord audit`` reports 0 duplicates and 0 missing."""
from __future__ import annotations

import json

import pytest

from flight_overlord.client import StepFetcher
from flight_overlord.config import ConfigError, load_config
from flight_overlord.deploy import cli
from flight_overlord.deploy.launch import LocalCluster

from ..helpers import journal_records, train, write_config
from .test_data_order import kill_all, read_steps


def audit(path, capsys) -> dict:
    cli.main(["audit", str(load_config(path).run_dir), "--json"])
    return json.loads(capsys.readouterr().out)


def test_skip_steps_10_to_14_live_then_kill_and_resume_with_more_skipped_in_the_config(corpus, tmp_path, capsys):
    """Steps 10-14 skipped live, every role killed at step 12 (in the window), resumed with the config
    adding a skip of steps 15-16, which the Planner had planned already: planned again from step 12."""
    steps, cut = 20, 12
    undisturbed = write_config(tmp_path / "undisturbed", corpus, checkpoint={"every": 4}, skip=["10:14", "15:16"])
    with LocalCluster(undisturbed) as cluster:
        reference = read_steps(cluster.planner, range(steps))
    path = write_config(tmp_path / "live", corpus, checkpoint={"every": 4})
    with LocalCluster(path) as cluster:
        before = read_steps(cluster.planner, range(2))
        cli.main(["skip", cluster.planner, "--config", str(path), "--steps", "10:14"])
        assert capsys.readouterr().out.startswith("steps 10-14 (set): the samples they would have had are dropped")
        cli.main(["status", cluster.planner, "--once"])
        assert "skipped steps (their samples dropped): 10-14" in capsys.readouterr().out
        before.update(read_steps(cluster.planner, range(2, cut + 2)))
        kill_all(cluster)
    write_config(tmp_path / "live", corpus, checkpoint={"every": 4}, skip=["10:14", "15:16"])
    with LocalCluster(path, mode="resume") as cluster:
        after = read_steps(cluster.planner, range(cut, steps))
    assert {**{s: before[s] for s in range(cut)}, **after} == reference
    assert [r["rewind"] for r in journal_records(path) if "rewind" in r] == [cut]  # 15-16 were planned before
    report = audit(path, capsys)
    assert report["duplicates"] == 0 and report["missing"] == 0 and report["through_step"] == steps - 1
    assert report["skipped_steps"] == list(range(10, 17)) and report["skipped"] > 0
    assert report["samples"] == sum(len(v) for v in reference.values())
    assert sum(v["skipped"] for v in report["per_source"].values()) == report["skipped"]
    cli.main(["audit", str(load_config(path).run_dir)])
    assert f"skipped on purpose (overlord skip): {report['skipped']} samples that steps 10-16 would have had" \
        in capsys.readouterr().out


SHAPE = {"batch": {"ramp": {"from": 8, "to": 32, "start": 0, "end": 40}},
         "context": [{"from_step": 0, "context_length": 2048, "microbatches": 4},
                     {"from_step": 20, "context_length": 8192, "microbatches": 2,
                      "weights": {"longdocs": 0.6, "code": 0.4}}]}


def rows_of(planner: str, step: int) -> int:
    """Rank 0's microbatches of ``step``."""
    fetcher = StepFetcher(planner, 0, timeout=120)
    try:
        return fetcher.fetch(step).num_rows
    finally:
        fetcher.close()


def shape_config(directory, corpus):
    return write_config(directory, corpus, checkpoint={"every": 4}, schedule=SHAPE,
                        global_batch={"context_length": 8192, "microbatches": 4, "samples_per_step": 8})


def test_a_batch_ramp_and_a_context_stage_killed_mid_ramp_and_resumed_across_the_stage(corpus, tmp_path, capsys):
    """8 -> 32 samples per step over 40 steps; sequences of 2K in 4 microbatches per rank until step 20,
    then of 8K in 2, with the stage's own mixture. Every role killed at step 18 (the Planner had planned
    past step 20), resumed: every rank's stream equals the undisturbed run's."""
    steps, cut = 42, 18
    with LocalCluster(shape_config(tmp_path / "undisturbed", corpus)) as cluster:
        reference = read_steps(cluster.planner, range(steps))
        rows = {steps: rows_of(cluster.planner, steps)}  # planned ahead, not read yet
    path = shape_config(tmp_path / "killed", corpus)
    with LocalCluster(path) as cluster:
        before = read_steps(cluster.planner, range(cut))
        rows.update({step: rows_of(cluster.planner, step) for step in (cut, cut + 1)})  # read past the cut
        kill_all(cluster)
    with LocalCluster(path, mode="resume") as cluster:
        after = read_steps(cluster.planner, range(cut, steps))
    assert rows == {cut: 4, cut + 1: 4, steps: 2}  # microbatches of rank 0: its stage's
    assert {**{s: before[s] for s in range(cut)}, **after} == reference
    drawn = {r["step"]: r["stats"]["deferred"] + sum(r["stats"]["samples"].values()) for r in journal_records(path)
             if "digest" in r}
    assert [drawn[s] for s in (0, 10, 20, 39, 40, 41)] == [8, 14, 20, 31, 32, 32]  # the ramp, deferrals included
    assert max(n for _, n in reference[19]) <= 2048 < max(n for s in range(20, steps) for _, n in reference[s])
    report = audit(path, capsys)
    assert report["duplicates"] == 0 and report["missing"] == 0
    assert report["samples"] == sum(len(v) for v in reference.values())
    first, stage = report["phases"]
    assert (first["from_step"], stage["from_step"], stage["edits"][0]["kind"]) == (0, 20, "context 8192")
    assert set(stage["samples"]) == {"longdocs", "code"} and len(first["samples"]) == 6


def shape_change_config(directory, corpus, *, cp: int, pp: int, microbatches: int, seed: int = 7):
    """2 samples per rank and step, each at most a microbatch (the loaders cut there): no layout defers one."""
    return write_config(directory, corpus, checkpoint={"every": 4}, mesh={"dp": 2, "cp": cp, "pp": pp}, seed=seed,
                        global_batch={"context_length": 4096, "microbatches": microbatches, "samples_per_step": 4})


def test_resume_with_cp_1_to_2_pp_1_to_2_and_microbatches_4_to_2(corpus, tmp_path, capsys):
    """Killed at step 8 with cp 1, pp 1 and 4 microbatches per rank, resumed with cp 2, pp 2 and 2: the
    steps from 8 on are planned again on the new layout from the state step 7 left, so every rank's
    stream from there equals a run started on the new layout (the same samples are drawn per step).
    Trainers (TrainerClient threads, one per rank) read concurrently, as a constructor's ranks resume together."""
    steps, cut = 14, 8
    with LocalCluster(shape_change_config(tmp_path / "new_layout", corpus, cp=2, pp=2, microbatches=2)) as cluster:
        reference = train(cluster.planner, 0, steps, ranks=8)
    path = shape_change_config(tmp_path / "changed", corpus, cp=1, pp=1, microbatches=4)
    with LocalCluster(path) as cluster:
        train(cluster.planner, 0, cut + 2, ranks=2)
        kill_all(cluster)
    shape_change_config(tmp_path / "changed", corpus, cp=2, pp=2, microbatches=2, seed=8)
    refused = LocalCluster(path, mode="resume")  # the read order follows the seed: no re-plan makes it exact
    with pytest.raises(ConfigError, match="seed: 7 when the run planned its steps, 8 now"):
        refused.start()
    assert not refused.children, "a role started before the check"
    shape_change_config(tmp_path / "changed", corpus, cp=2, pp=2, microbatches=2)
    with LocalCluster(path, mode="resume") as cluster:
        after = train(cluster.planner, cut, steps, ranks=8)
    assert after == {rank: [(s, d) for s, d in stream if s >= cut] for rank, stream in reference.items()}
    assert [r["rewind"] for r in journal_records(path) if "rewind" in r] == [cut]
    report = audit(path, capsys)
    assert report["duplicates"] == 0 and report["missing"] == 0 and report["through_step"] == steps - 1
