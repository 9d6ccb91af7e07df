"""Starvation attribution end to end: one source's loader slowed on purpose (``faults.slow_sources``);
the ranks' data waits are charged to that source's loader fetch in ``overlord status``. The
attribution logic alone: tests/unit/test_starvation.py."""
from __future__ import annotations

import pyarrow.flight as fl
import pytest

from flight_overlord import wire
from flight_overlord.client import TrainerClient
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.deploy.status import cluster_status, render
from flight_overlord.faults import slow_sources_plugin

from ..helpers import each_rank, write_config

SLOW, STEPS = "captions", 6  # short samples: every step, every rank has some


def test_a_slowed_source_is_named_as_the_cause_of_the_wait(corpus, tmp_path):
    slowed = slow_sources_plugin(tmp_path, tmp_path / "run", {SLOW: 0.4})  # every role's process imports it
    path = write_config(tmp_path, corpus, plugins=[str(slowed)])

    def train(planner, rank):  # a fast training loop: it waits for data every step
        with TrainerClient(planner, rank, num_steps=STEPS, timeout=60) as client:
            for batch in client:
                client.report(batch[0]["step"], {})

    with LocalCluster(path) as cluster:
        each_rank(train, cluster.planner, 2)
        status = cluster_status(cluster.planner)
        planner = fl.connect(cluster.planner)
        with pytest.raises(fl.FlightServerError, match="does not fit that cost model"):  # no cost.fit
            wire.call(planner, "report", {"step": 0, "rank": 0, "compute_seconds": 1.0})
        with pytest.raises(fl.FlightServerError, match="unknown wait 'lunch'"):
            wire.call(planner, "report", {"step": 0, "rank": 0, "losses": {}, "waits": {"lunch": 1.0}})
    starvation = status["starvation"]
    top = starvation["causes"][0]
    assert (top["stage"], top["source"], top["ranks"]) == ("loader fetch", SLOW, [0, 1])
    for rank in ("0", "1"):
        entry = starvation["ranks"][rank]
        assert entry["cause"]["source"] == SLOW and max(entry["stages"], key=entry["stages"].get) == "loader:" + SLOW
        # the injected delays, waited out: 0.4 s a fetch, of which prefetching hides a varying part on a busy machine
        assert entry["stages"]["loader:" + SLOW] >= 0.2
        assert entry["starved"] > 0 and "ticket" in entry["stages"]  # the trainer's side came with its reports
    assert f"loader fetch of source '{SLOW}' starves ranks 0,1" in render(status)
    assert status["cost"] == {"fit": False, "model": "attention", "a": 1.0, "b": 1 / 4096}
