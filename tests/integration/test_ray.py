"""The Ray backend: the same roles as Ray actors on a local Ray (bounded, loopback, usage reporting
off). A stock Flight client audits the run, the streams equal the local backend's, and a kill -9 of
an actor's process (Ray restarts it on the same address) changes no rank's stream."""
from __future__ import annotations


import pyarrow.flight as fl
import pytest

from flight_overlord.client import StepFetcher
from flight_overlord.config import load_config
from flight_overlord.deploy.ray_backend import RayCluster

from ..helpers import delivered_keys, fetch_run, journal, write_config

STEPS = 12


def _keys_per_step(tables) -> list[list[list[str]]]:
    return [t.column("sample_keys").to_pylist() for t in tables]


@pytest.fixture(scope="module")
def local_reference(corpus, tmp_path_factory):
    path = write_config(tmp_path_factory.mktemp("local"), corpus, loaders={"captions": 2})
    return {r: _keys_per_step(tables) for r, tables in fetch_run(path, STEPS).items()}


def test_ray_backend_serves_the_local_streams_and_survives_kill_9(local_reference, corpus, tmp_path):
    path = write_config(tmp_path, corpus, loaders={"captions": 2})
    ranks = load_config(path).mesh.world_size
    cluster = RayCluster(path)
    cluster.start()
    try:
        # a stock Flight client follows the Planner's endpoint to the constructor actor
        stock = fl.connect(cluster.planner)
        info = stock.get_flight_info(fl.FlightDescriptor.for_path("batch", "0", "0"))
        first = fl.connect(info.endpoints[0].locations[0].uri.decode()).do_get(info.endpoints[0].ticket).read_all()
        assert first.num_rows > 0
        fetchers = [StepFetcher(cluster.planner, r, timeout=120) for r in range(ranks)]
        run = {r: [first] if r == 0 else [] for r in range(ranks)}
        for step in range(STEPS):
            if step == 4:
                cluster.kill("loader-captions-1")
            if step == 8:
                cluster.kill("planner")
            for r, f in enumerate(fetchers):
                if not (step == 0 and r == 0):
                    run[r].append(f.fetch(step))
        for f in fetchers:
            f.close()
        cluster.wait_restarted("planner")  # Ray brought it back on its own address
    finally:
        cluster.stop()
    assert {r: _keys_per_step(tables) for r, tables in run.items()} == local_reference
    planned = [k for record in journal(path)[:STEPS] for b in record["bins"] for k in b]
    delivered = [k for r in run for k in delivered_keys(run[r])]
    assert sorted(delivered) == sorted(planned) and len(set(delivered)) == len(delivered)
