"""The training run's own schedule (issue 33) on real servers, each with a kill -9 of every role and a
resume: skipped steps. Every rank's stream is compared with an undisturbed run of the same config, and
``overlord audit`` reports 0 duplicates and 0 missing."""
from __future__ import annotations

import json

from flight_overlord.config import load_config
from flight_overlord.deploy import cli
from flight_overlord.deploy.launch import LocalCluster

from ..helpers import journal_records, write_config
from .test_data_order import kill_all, stock_read


def audit(path, capsys) -> dict:
    cli.main(["audit", str(load_config(path).run_dir), "--json"])
    return json.loads(capsys.readouterr().out)


def test_skip_steps_10_to_14_live_then_kill_and_resume_with_more_skipped_in_the_config(corpus, tmp_path, capsys):
    """Steps 10-14 skipped live, every role killed at step 12 (in the window), resumed with the config
    adding a skip of steps 15-16, which the Planner had planned already: planned again from step 12."""
    steps, cut = 20, 12
    undisturbed = write_config(tmp_path / "undisturbed", corpus, checkpoint={"every": 4}, skip=["10:14", "15:16"])
    with LocalCluster(undisturbed) as cluster:
        reference = stock_read(cluster.planner, range(steps))
    path = write_config(tmp_path / "live", corpus, checkpoint={"every": 4})
    with LocalCluster(path) as cluster:
        before = stock_read(cluster.planner, range(2))
        cli.main(["skip", cluster.planner, "--config", str(path), "--steps", "10:14"])
        assert capsys.readouterr().out.startswith("steps 10-14 (set): the samples first drawn for them are dropped")
        before.update(stock_read(cluster.planner, range(2, cut + 2)))
        kill_all(cluster)
    write_config(tmp_path / "live", corpus, checkpoint={"every": 4}, skip=["10:14", "15:16"])
    with LocalCluster(path, mode="resume") as cluster:
        after = stock_read(cluster.planner, range(cut, steps))
    assert {**{s: before[s] for s in range(cut)}, **after} == reference
    assert [r["rewind"] for r in journal_records(path) if "rewind" in r] == [cut]  # 15-16 were planned before
    report = audit(path, capsys)
    assert report["duplicates"] == 0 and report["missing"] == 0 and report["through_step"] == steps - 1
    assert report["skipped_steps"] == list(range(10, 17)) and report["skipped"] > 0
    assert report["samples"] == sum(len(v) for v in reference.values())
    assert sum(v["skipped"] for v in report["per_source"].values()) == report["skipped"]
    cli.main(["audit", str(load_config(path).run_dir)])
    assert f"skipped on purpose (overlord skip): {report['skipped']} samples first drawn for steps 10-16" \
        in capsys.readouterr().out
