"""The Ray backend: the same roles as Ray actors on a local Ray (bounded, loopback, usage reporting
off). A stock Flight client audits the run, the streams equal the local backend's, and a kill -9 of
an actor's process (Ray restarts it on the same address) changes no rank's stream. Placement: custom
resources of the one local node stand in for a CPU node and a trainer node."""
from __future__ import annotations

import os

import pyarrow.flight as fl
import pytest

from flight_overlord.client import StepFetcher
from flight_overlord.config import ConfigError, load_config
from flight_overlord.deploy.ray_backend import NODE_SHARE, RayCluster, actor_options, pinned_port_args
from flight_overlord.deploy.topology import loader_hosts

from ..helpers import delivered_keys, fetch_run, journal, write_config
from .test_their_code import assert_plugin_tokens, with_plugin_transform

STEPS = 12




@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module, whose node also offers the custom resources the configs ask for."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, resources={"cpu-node": 1, "trainer-node-b": 1}, include_dashboard=False,
             log_to_driver=False, configure_logging=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


def _node_ip(ray) -> str:
    """The local node's IP, as Ray names it in its ``node:IP`` resource."""
    return next(k[5:] for k in ray.cluster_resources() if k.startswith("node:") and not k.startswith("node:__"))


def _keys_per_step(tables) -> list[list[list[str]]]:
    return [t.column("sample_keys").to_pylist() for t in tables]


@pytest.fixture(scope="module")
def local_reference(corpus, tmp_path_factory):
    path = write_config(tmp_path_factory.mktemp("local"), corpus, loaders={"captions": 2})
    return {r: _keys_per_step(tables) for r, tables in fetch_run(path, STEPS).items()}


def test_ray_backend_serves_the_local_streams_and_survives_kill_9(local_ray, local_reference, corpus, plugin_file,
                                                                  tmp_path):
    """The actors also import the config's plugins: qa's transform is the user's own, in a file the
    config names (it shifts the bytes: the same lengths, so the same plans and keys as the local run)."""
    ip = _node_ip(local_ray)  # rank 0 names its node by IP, rank 1 by a custom resource
    path = write_config(tmp_path, corpus, loaders={"captions": 2}, network={"host": "0.0.0.0"}, ray={
        "cpus": 0.05, "loader_resources": {"cpu-node": 0.01}, "trainer_nodes": [ip, "trainer-node-b"]})
    with_plugin_transform(path, plugin_file, "qa")
    ranks = load_config(path).mesh.world_size
    cluster = RayCluster(path)
    cluster.start()
    try:
        # bound to every interface, every actor advertises its node's IP
        assert all(c.location.startswith(f"grpc://{ip}:") for c in cluster.children), cluster.children
        placement = {c.name: c.placement for c in cluster.children}
        assert placement["constructor-0"]["resources"] == {f"node:{ip}": NODE_SHARE}  # rank 0's node IP
        assert placement["constructor-1"]["resources"] == {"trainer-node-b": NODE_SHARE}  # rank 1's resource
        # loader.hosts: auto (the default): the 7 loader actors on min(7, the Ray cluster's 2 CPUs) actors
        assert sorted(n for n in placement if n.startswith("loader-")) == ["loader-host0", "loader-host1"]
        loaders = [p for name, p in placement.items() if name.startswith("loader-")]
        assert len(loaders) == 2 and all(p["resources"] == {"cpu-node": 0.01} and p["scheduling_strategy"] == "SPREAD"
                                         and p["num_cpus"] == 0.05 for p in loaders)
        assert "resources" not in placement["planner"]  # anywhere
        free = local_ray.available_resources()  # the running actors hold what they asked for
        assert free["trainer-node-b"] == pytest.approx(1 - NODE_SHARE)
        assert free["cpu-node"] == pytest.approx(1 - 2 * 0.01)
        # a stock Flight client follows the Planner's endpoint to the constructor actor
        stock = fl.connect(cluster.planner)
        info = stock.get_flight_info(fl.FlightDescriptor.for_path("batch", "0", "0"))
        first = fl.connect(info.endpoints[0].locations[0].uri.decode()).do_get(info.endpoints[0].ticket).read_all()
        assert first.num_rows > 0
        fetchers = [StepFetcher(cluster.planner, r, timeout=120) for r in range(ranks)]
        run = {r: [first] if r == 0 else [] for r in range(ranks)}
        for step in range(STEPS):
            if step == 4:
                cluster.kill("loader-host1")  # round robin: captions[1], code[0], manuals[0] die together
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
    assert assert_plugin_tokens([t for tables in run.values() for t in tables], corpus) > 0
    planned = [k for record in journal(path)[:STEPS] for b in record["bins"] for k in b]
    delivered = [k for r in run for k in delivered_keys(run[r])]
    assert sorted(delivered) == sorted(planned) and len(set(delivered)) == len(delivered)


def test_placement_follows_the_trainer_nodes(corpus, tmp_path):
    """Pure: which node each constructor asks for, on a mesh whose constructors serve several ranks."""
    nodes = ["10.0.0.1"] * 4 + ["10.0.0.2"] * 3 + ["gpu-c"] + ["gpu-d"] * 8  # 16 ranks: tp2 x dp8
    cfg = load_config(write_config(tmp_path, corpus, mesh={"dp": 8, "tp": 2}, constructor={"dp_per_constructor": 2},
                                   ray={"trainer_nodes": nodes}))
    chosen = [actor_options(cfg, "constructor", c)["resources"] for c in range(cfg.num_constructors)]
    assert chosen == [{"node:10.0.0.1": NODE_SHARE}, {"node:10.0.0.2": NODE_SHARE},  # 10.0.0.2 holds 3 of 4 ranks
                      {"gpu-d": NODE_SHARE}, {"gpu-d": NODE_SHARE}]
    assert actor_options(cfg, "loader") == {"num_cpus": 0.1, "scheduling_strategy": "SPREAD"}
    with pytest.raises(ConfigError, match="ray.trainer_nodes: 2 entries, but the mesh has 16 trainer ranks"):
        load_config(write_config(tmp_path, corpus, mesh={"dp": 8, "tp": 2}, ray={"trainer_nodes": ["a", "b"]}))
    with pytest.raises(ConfigError, match="ray.cpus: must be > 0"):
        load_config(write_config(tmp_path, corpus, ray={"cpus": 0}))


def test_a_resource_no_node_offers_is_a_clear_error(local_ray, corpus, tmp_path):
    path = write_config(tmp_path, corpus, ray={"trainer_nodes": [_node_ip(local_ray), "no-such-node"]})
    with pytest.raises(ConfigError, match=r"ray.trainer_nodes\[1\]: no node of this Ray cluster offers resource "
                                          r"'no-such-node' \(offered: .*trainer-node-b"):
        RayCluster(path).start()


def test_ray_backend_auto_partitions_at_start_up(local_ray, local_reference, corpus, tmp_path):
    """``loader.partition: auto`` under Ray as under the local backend (one start-up for both): the
    plan is made before any actor starts, the loader actors are the plan's hosts, and the streams
    are those of the config as written (actor counts never change a stream). Then a resume of the
    stopped run (``overlord up --backend ray --resume``): the Planner comes back on its previous port,
    where the trainers look, and the run goes on with the undisturbed stream."""
    path = write_config(tmp_path, corpus, loader={"partition": "auto", "budget": {"cpus": 2, "memory_gib": 2}},
                        ray={"cpus": 0.05})
    steps = 3
    with RayCluster(path) as cluster:
        cfg = load_config(path)  # now with the plan applied
        assert (cfg.run_dir / "partition" / "plan.json").exists()
        assert sorted(c.name for c in cluster.children if c.spec.role == "loader") == \
            sorted(name for name, _ in loader_hosts(cfg))
        fetchers = [StepFetcher(cluster.planner, r, timeout=120) for r in range(cfg.mesh.world_size)]
        run = {r: [f.fetch(step) for step in range(steps)] for r, f in enumerate(fetchers)}
        for f in fetchers:
            f.close()
        address = cluster.planner
    assert load_config(path).network.planner_port == 0  # any free port at the first start
    with RayCluster(path, mode="resume") as again:
        assert again.planner == address
        fetchers = [StepFetcher(address, r, timeout=120) for r in range(cfg.mesh.world_size)]
        for r, f in enumerate(fetchers):
            run[r].append(f.fetch(steps))
            f.close()
    assert {r: _keys_per_step(tables) for r, tables in run.items()} == \
        {r: keys[:steps + 1] for r, keys in local_reference.items()}


def test_a_ray_actor_is_pinned_to_a_port_and_a_resumed_planner_to_its_previous_one(corpus, tmp_path):
    """Pure: the ``--port`` each role's actor gets (fixed, so that Ray's restart comes back on it)."""
    cfg = load_config(write_config(tmp_path, corpus))
    assert pinned_port_args(cfg, "planner", ["planner", "--port", "4711"]) == []  # the resume's own
    fixed = load_config(write_config(tmp_path, corpus, network={"planner_port": 4712}))
    assert pinned_port_args(fixed, "planner", ["planner"]) == ["--port", "4712"]
    for role, config in (("planner", cfg), ("loader", fixed), ("constructor", fixed)):
        flag, port = pinned_port_args(config, role, [role])
        assert flag == "--port" and int(port) > 0

