"""cluster_status on a real deployment: every role up with consistent counters, then one loader down."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from flight_overlord.client import StepFetcher
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.deploy.status import cluster_status

from ..helpers import write_config

SOURCES = {"captions": 2, "longdocs": 1}  # source -> loader actors
STEPS = 2
RANKS = 2


def _settled(planner: str, deadline: float) -> dict:
    """The status once the constructors' prefetch is done: no counter moves between two readings."""
    previous = None
    while True:
        status = cluster_status(planner)
        now = (status["totals"]["bytes_served"], status["totals"]["bytes_fetched"])
        if now == previous or time.monotonic() > deadline:
            return status
        previous = now
        time.sleep(0.3)


def test_cluster_status_reports_every_role(corpus, tmp_path):
    sources = [{"name": name, "paths": f"{name}/*.parquet", "weight": 1.0, "loaders": n} for name, n in SOURCES.items()]
    # one process per loader actor: the one killed below is reported down alone
    config = write_config(tmp_path, corpus, sources=sources, mesh={"dp": RANKS}, loader={"hosts": 0})
    with LocalCluster(config) as cluster:
        fetchers = [StepFetcher(cluster.planner, rank, timeout=60) for rank in range(RANKS)]
        try:
            fetched = [[f.fetch(step).nbytes for f in fetchers] for step in range(STEPS)]
        finally:
            for f in fetchers:
                f.close()
        assert all(n > 0 for step in fetched for n in step)

        status = _settled(cluster.planner, time.monotonic() + 30)
        assert status["up"], status["totals"]["down"]
        planner = status["planner"]
        assert planner["address"] == cluster.planner and planner["up"] and planner["reason"] is None
        assert planner["counters"]["ready"] is True and planner["counters"]["error"] is None
        assert planner["counters"]["planned"] >= STEPS - 1
        assert planner["counters"]["requested"] == {str(r): STEPS - 1 for r in range(RANKS)}

        loaders = status["loaders"]
        assert sorted((lo["source"], lo["actor"], lo["replica"]) for lo in loaders) == \
            sorted((s, a, 0) for s, n in SOURCES.items() for a in range(n))
        for lo in loaders:
            assert lo["up"] and lo["address"].startswith("grpc://") and lo["row_groups"] > 0
            assert lo["counters"]["source"] == lo["source"] and lo["counters"]["actor"] == lo["actor"]
            assert lo["counters"]["row_groups_owned"] == lo["row_groups"]
            assert lo["counters"]["bytes_served"] >= 0

        constructors = status["constructors"]
        assert [c["index"] for c in constructors] == list(range(RANKS))  # dp_per_constructor 1
        for c in constructors:
            assert c["up"] and c["counters"]["error"] is None
            assert c["counters"]["assembled"] >= STEPS - 1 and c["counters"]["bytes_fetched"] > 0

        totals = status["totals"]
        assert totals["roles"] == totals["roles_up"] == 1 + len(loaders) + len(constructors)
        assert totals["down"] == [] and totals["bad_samples"] == 0
        assert set(totals["bytes_served_by_source"]) == set(SOURCES)
        assert all(n > 0 for n in totals["bytes_served_by_source"].values())
        assert totals["bytes_served"] == sum(lo["counters"]["bytes_served"] for lo in loaders)
        assert totals["bytes_fetched"] == sum(c["counters"]["bytes_fetched"] for c in constructors)
        # What the loaders served is what the constructors fetched, but for the validity bitmaps: a
        # loader counts the nbytes of its ``take`` result, which has them, and the IPC stream does not
        # carry a bitmap without nulls, so the constructor's received table is a few bytes smaller.
        assert totals["bytes_fetched"] > 0
        # (a loader builds one table per call with ``take``s, each array and child array with its bitmap:
        # ~2.5% of these small steps' bytes)
        assert 0 <= totals["bytes_served"] - totals["bytes_fetched"] <= totals["bytes_served"] // 20

        # The operator's view of the same: `overlord status` (a page, and JSON for machines).
        page = subprocess.run([sys.executable, "-m", "flight_overlord.deploy.cli", "status", cluster.planner, "--once"],
                              capture_output=True, text=True, timeout=60)
        assert page.returncode == 0, page.stderr
        assert f"planned up to step {planner['counters']['planned']}" in page.stdout
        assert all(f"{s}[{a}]" in page.stdout for s, n in SOURCES.items() for a in range(n))
        machine = subprocess.run([sys.executable, "-m", "flight_overlord.deploy.cli", "status", cluster.planner,
                                  "--json"], capture_output=True, text=True, timeout=60)
        assert json.loads(machine.stdout)["up"] is True

        # A role that does not answer is reported down, not raised.
        victim = next(c for c in cluster.children if c.name == "loader-captions-1")
        victim.process.kill()
        victim.process.wait(10)
        status = cluster_status(cluster.planner, timeout=5)
        assert not status["up"]
        down = [lo for lo in status["loaders"] if not lo["up"]]
        assert [(lo["source"], lo["actor"]) for lo in down] == [("captions", 1)]
        assert down[0]["counters"] == {} and down[0]["reason"]
        assert status["planner"]["up"] and all(c["up"] for c in status["constructors"])
        assert status["totals"]["roles_up"] == status["totals"]["roles"] - 1
        assert len(status["totals"]["down"]) == 1 and "captions[1]" in status["totals"]["down"][0]
