"""``loader.hosts``: ``auto`` (the default) puts the loader actors in min(ceil(actors / 4), CPUs) processes,
dealt round robin as ``hosts: N`` does; 0 is one process per actor; anything else is a named error."""
from __future__ import annotations

import pytest

from flight_overlord.config import ConfigError, load_config
from flight_overlord.deploy.topology import ACTORS_PER_HOST, NODE, STANDBY, loader_hosts, machine_cpus, roles

from ..helpers import WEIGHTS, write_config

ACTORS = [(s, a) for s in WEIGHTS for a in range(2 if s == "captions" else 1)]  # 7: captions in two


def _cfg(tmp_path, corpus, **loader):
    sections = {"loader": loader} if loader else {}
    return load_config(write_config(tmp_path, corpus, loaders={"captions": 2}, **sections))


def test_auto_is_the_default_and_deals_four_actors_a_process_at_most_one_per_cpu(corpus, tmp_path):
    cfg = _cfg(tmp_path, corpus)
    assert cfg.loader.hosts == "auto"
    two = loader_hosts(cfg, cpus=2)
    assert two == [("loader-host0", ACTORS[0::2]), ("loader-host1", ACTORS[1::2])]
    assert loader_hosts(cfg, cpus=2) == loader_hosts(_cfg(tmp_path / "n", corpus, hosts=2))  # as hosts: 2
    # more CPUs than that: still ceil(7 / ACTORS_PER_HOST) = 2 processes, not one per actor
    assert loader_hosts(cfg, cpus=64) == two
    assert loader_hosts(cfg, cpus=1) == [("loader-host0", ACTORS)]
    assert len(loader_hosts(cfg)) == min(-(-len(ACTORS) // ACTORS_PER_HOST), machine_cpus())  # this machine's
    assert 1 <= machine_cpus()


def test_zero_is_one_process_per_actor_and_n_is_n_whatever_the_cpus(corpus, tmp_path):
    per_actor = [(f"loader-{s}-{a}", [(s, a)]) for s, a in ACTORS]
    assert loader_hosts(_cfg(tmp_path / "0", corpus, hosts=0), cpus=1) == per_actor
    three = loader_hosts(_cfg(tmp_path / "3", corpus, hosts=3), cpus=1)
    assert [name for name, _ in three] == ["loader-host0", "loader-host1", "loader-host2"]
    assert sorted(a for _, actors in three for a in actors) == sorted(ACTORS)  # each actor exactly once


@pytest.mark.parametrize("value", ["many", "AUTO", -1, True, 1.5, None])
def test_bad_hosts_values_are_named(corpus, tmp_path, value):
    with pytest.raises(ConfigError, match=r"loader\.hosts: expected auto, 0 .* got "):
        _cfg(tmp_path, corpus, hosts=value)


def test_single_node_deployment_is_one_loader_process_and_one_constructor_unless_the_config_says(corpus, tmp_path):
    """``deployment: single_node``: the defaults of loader.hosts (1) and constructor.dp_per_constructor
    (every data-parallel rank); keys the config sets win; an unknown deployment is a named error."""
    def cfg(name, **top):
        return load_config(write_config(tmp_path / name, corpus, loaders={"captions": 2}, mesh={"dp": 4}, **top))
    node = cfg("node", deployment="single_node")
    assert loader_hosts(node, cpus=8) == [("loader-host0", ACTORS)] and node.num_constructors == 1
    default = cfg("default")
    assert len(loader_hosts(default, cpus=8)) == 2 and default.num_constructors == 4
    mine = cfg("mine", deployment="single_node", loader={"hosts": 2}, constructor={"dp_per_constructor": 2})
    assert len(loader_hosts(mine, cpus=8)) == 2 and mine.num_constructors == 2
    with pytest.raises(ConfigError, match="deployment"):
        cfg("bad", deployment="one_box")


def test_roles_is_the_one_role_list_planner_first(corpus, tmp_path):
    """Both backends start ``roles(cfg)``: the Planner first (the others need its address), its standby
    where the backend runs one, every loader host and its shadows, one constructor per index."""
    cfg = load_config(write_config(tmp_path, corpus, loaders={"captions": 2}, loader={"hosts": 2, "shadows": 1},
                                   planner={"standbys": 1}))
    specs = roles(cfg, resume=True)
    assert [(s.name, s.role) for s in specs[:2]] == [("planner", "planner"), (STANDBY, "planner")]
    assert specs[0].args == ("--resume",) and specs[1].standby and not specs[0].standby
    loaders = [s for s in specs if s.role == "loader"]
    assert [s.name for s in loaders] == ["loader-host0", "loader-host0-shadow1", "loader-host1", "loader-host1-shadow1"]
    assert [s.replica for s in loaders] == [0, 1, 0, 1]
    assert sorted({a for s in loaders for a in s.actors}) == sorted(ACTORS)
    assert loaders[1].args == ("--actors", ",".join(f"{s}:{a}" for s, a in loaders[1].actors), "--replica", "1")
    constructors = [s for s in specs if s.role == "constructor"]
    assert [(s.name, s.index) for s in constructors] == [(f"constructor-{c}", c) for c in range(cfg.num_constructors)]
    assert STANDBY not in [s.name for s in roles(cfg, standbys=False)]  # Ray restarts the Planner in place


def test_single_node_is_one_process_where_the_backend_can_run_it_and_no_replica_needs_its_own(corpus, tmp_path):
    """``deployment: single_node`` on a backend that hosts every role in one process (``one_process``):
    one ``node`` role (``--resume`` passed on); a standby Planner or loader shadows keep their own processes
    (they stand in for a process that dies), as does a backend that runs each role apart (Ray)."""
    def cfg(name, **top):
        return load_config(write_config(tmp_path / name, corpus, loaders={"captions": 2}, deployment="single_node",
                                        **top))
    node = cfg("node")
    one_process = roles(node, one_process=True, resume=True)
    assert [(s.name, s.role, s.args) for s in one_process] == [(NODE, NODE, ("--resume",))]
    assert [s.role for s in roles(node)] == ["planner", "loader", "constructor"]  # the roles the node hosts
    for replicas in ({"planner": {"standbys": 1}}, {"loader": {"shadows": 1}}):
        assert NODE not in [s.name for s in roles(cfg(next(iter(replicas)), **replicas), one_process=True)]
    default = load_config(write_config(tmp_path / "default", corpus))
    assert NODE not in [s.name for s in roles(default, one_process=True)]


def test_serve_node_refuses_a_config_whose_replicas_need_their_own_processes(corpus, tmp_path):
    """``overlord serve node`` by hand on a config with a standby Planner: a clear error before any
    role starts (a standby inside the process it stands in for would die with it)."""
    from flight_overlord.deploy import node
    path = write_config(tmp_path, corpus, deployment="single_node", planner={"standbys": 1})
    with pytest.raises(SystemExit, match="needs 'deployment: single_node' without planner.standbys"):
        node.main(["--config", str(path)])


def test_serve_node_takes_the_shared_role_flags(corpus, tmp_path):
    """``overlord serve node`` parses the flags every ``overlord serve ROLE`` has (``role_parser``): a
    wrong ``--advertise`` is an error naming the flag before any of its roles starts."""
    from flight_overlord.deploy import node
    path = write_config(tmp_path, corpus, deployment="single_node")
    with pytest.raises(SystemExit, match="--advertise: 'grpc://x:1' is not a host name"):
        node.main(["--config", str(path), "--advertise", "grpc://x:1"])


@pytest.mark.parametrize("ports_file", ['{"planner": 4', '["planner", 4]', '{"planner": "four"}', '{"planner": 0}'])
def test_serve_node_recover_names_an_unreadable_ports_file_where_the_registrations_cannot_stand_in(
        corpus, tmp_path, ports_file):
    """``node-ports.json`` that does not parse, and no registrations of the Planner to take the ports
    from (the run's recovery test covers the case where they are there): a clear error naming both
    files and what to do, before any role starts."""
    from flight_overlord.deploy import node
    path = write_config(tmp_path, corpus, deployment="single_node")
    cfg = load_config(path)
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / node.PORTS_FILE).write_text(ports_file)
    with pytest.raises(SystemExit) as error:
        node.main(["--config", str(path), "--recover"])
    message = str(error.value)
    assert f"{cfg.run_dir / node.PORTS_FILE} is unreadable" in message
    assert str(cfg.run_dir / "planner" / "registry.json") in message and "--resume" in message


def test_serve_node_gives_each_role_its_own_metrics_port():
    """``metrics.port`` P (or ``--metrics-port``): the hosted roles at P, P+1, ... in ``roles`` order; 0:
    each any free port; past 65535: an error naming the port and the roles."""
    from flight_overlord.deploy.node import metrics_ports
    names = ["planner", "loader-host0", "constructor-0"]
    assert metrics_ports(9100, names) == {"planner": ["--metrics-port", "9100"], "loader-host0": ["--metrics-port",
                                          "9101"], "constructor-0": ["--metrics-port", "9102"]}
    assert metrics_ports(0, names) == {name: ["--metrics-port", "0"] for name in names}
    assert metrics_ports(None, names) == {name: [] for name in names}
    with pytest.raises(SystemExit, match="metrics port 65534: its 3 roles need ports 65534..65536"):
        metrics_ports(65534, names)
