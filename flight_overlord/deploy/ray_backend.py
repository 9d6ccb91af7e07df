"""The Ray backend: the same roles as Ray actors, each hosting the same Flight server as a process of
``LocalCluster`` does, on a fixed port so that Ray's restart of a killed actor comes back on the same
address and rebuilds from the run's journals (the Planner with ``--recover``).

    overlord up --backend ray CONFIG [--address auto|HOST:PORT]

Without ``--address`` a local Ray is started with this machine's CPUs (usage reporting off, no
dashboard); with one, the roles join that cluster. Placement (:func:`actor_options`, from the config's
``ray`` section): every actor asks for ``ray.cpus`` (a fraction of a CPU, so many fit on a node);
loader actors also ask for ``ray.loader_resources`` (say a custom resource only CPU nodes offer) and
are spread over the nodes that have them; with ``ray.trainer_nodes`` (a node IP or a custom resource
per trainer rank) each constructor asks for the node of most of the ranks it serves; the Planner runs
anywhere. The config file, the data (local paths on a shared file system, or URIs) and the
``run_dir`` must be reachable from every node.
"""
from __future__ import annotations

import importlib
import os
import ipaddress
import signal
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

from ..config import Config, ConfigError
from ..role_process import WILDCARDS
from ..wire.security import SECRET_ENV, secret_path, write_secret
from .launch import LocalCluster, loader_hosts

NODE_SHARE = 0.001  # of a node's resource (node:IP or a custom one): pins an actor there without using it up


def node_resource(node: str) -> str:
    """The Ray resource that pins an actor to a trainer node: ``node:IP`` (every Ray node has its own) for
    an IP address, else the custom resource of that name (``ray start --resources '{"NAME": 1}'``)."""
    try:
        return f"node:{ipaddress.ip_address(node)}"
    except ValueError:
        return node


def constructor_node(cfg: Config, index: int) -> str | None:
    """The trainer node constructor ``index`` belongs on: where most of the ranks it serves are (ties: the
    node of its lowest rank); None when the config names no trainer nodes."""
    nodes = cfg.ray.trainer_nodes
    if not nodes:
        return None
    mesh = cfg.trainer_mesh
    dps = set(mesh.dp_ranks_of(index))
    return Counter(nodes[r] for r in range(mesh.world_size) if mesh.coord(r).dp in dps).most_common(1)[0][0]


def actor_options(cfg: Config, role: str, index: int | None = None) -> dict:
    """Ray ``.options()`` placing one role's actor (pure: the config in, the options out)."""
    options: dict = {"num_cpus": cfg.ray.cpus}
    if role == "loader":
        options["scheduling_strategy"] = "SPREAD"
        if cfg.ray.loader_resources:
            options["resources"] = dict(cfg.ray.loader_resources)
    elif role == "constructor" and (node := constructor_node(cfg, index)) is not None:
        options["resources"] = {node_resource(node): NODE_SHARE}
    return options


def check_resources(cfg: Config, available: dict[str, float]) -> None:
    """Every resource the placement asks for is offered by some Ray node (else an actor would wait
    forever): a ConfigError names the key and the resource."""
    wanted = [(f"ray.loader_resources.{name}", name) for name in cfg.ray.loader_resources]
    wanted += [(f"ray.trainer_nodes[{rank}]", node_resource(node)) for rank, node in enumerate(cfg.ray.trainer_nodes)]
    for key, resource in wanted:
        if resource not in available:
            offered = sorted(r for r in available if not r.startswith(("node:__internal", "object_store")))
            raise ConfigError(f"{key}: no node of this Ray cluster offers resource {resource!r} "
                              f"(offered: {', '.join(offered)})")


class _Role:
    """One role in a Ray actor process. The class Ray runs is named after the role (``planner``,
    ``loader``, ``constructor``), so the process title Ray gives it (``ray::loader...``) names the role."""

    def __init__(self, role: str, argv: list[str], env: dict[str, str], advertise_node: bool = False):
        import ray
        os.environ.update(env)
        if role == "planner" and ray.get_runtime_context().was_current_actor_reconstructed:
            argv = [*argv, "--recover"]  # a restart of the Planner alone: keep the others' registrations
        if advertise_node:  # bound to every interface: reached at the IP of the node Ray placed it on
            argv = [*argv, "--advertise", ray.util.get_node_ip_address()]
        self.server, self.location, _ = importlib.import_module(f"flight_overlord.{role}.server").start(argv)

    def where(self) -> tuple[str, int]:
        return self.location, os.getpid()


@dataclass
class RayChild:
    name: str
    actor: object
    location: str
    pid: int
    placement: dict = field(default_factory=dict)  # the placement options it was started with
    restarts: list[float] = field(default_factory=list)


class RayCluster(LocalCluster):
    """``LocalCluster``'s interface (``start``, ``stop``, ``planner``, ``kill``, ``secret``) on Ray."""

    def __init__(self, config_path, *, address: str | None = None, mode: str = "new", startup_timeout: float = 120.0):
        super().__init__(config_path, mode=mode, supervise=False, startup_timeout=startup_timeout)
        self.address = address
        self._started_ray = False

    def start(self) -> str:
        import ray
        self._prepare_run_dir()
        self._check_sources()
        if self._secret_source != "file":  # the run's tools read it there, as with LocalCluster
            write_secret(secret_path(self.cfg), self.secret)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if not ray.is_initialized():
            local = {} if self.address else {"num_cpus": os.cpu_count()}
            if not self.address and self.cfg.network.host not in WILDCARDS:
                local["_node_ip_address"] = self.cfg.network.host
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False, configure_logging=False,
                     **local)
            self._started_ray = True
        try:
            resources = ray.cluster_resources()
            check_resources(self.cfg, resources)
            hosts = loader_hosts(self.cfg, int(resources.get("CPU", 0)) or None)  # hosts: auto: the cluster's CPUs
            config = ["--config", str(self.config_path)]
            planner = self._actor("planner", "planner", [*config, "--port", str(_free_port()),
                                                          *(["--resume"] if self.mode == "resume" else [])])
            self.planner = planner.location
            roles = [(name + (f"-shadow{r}" if r else ""), "loader", None,
                      [*config, "--actors", ",".join(f"{s}:{a}" for s, a in actors), "--replica", str(r)])
                     for name, actors in hosts for r in range(1 + self.cfg.loader.shadows)]
            roles += [(f"constructor-{c}", "constructor", c, [*config, "--index", str(c)])
                      for c in range(self.cfg.num_constructors)]
            for name, role, index, argv in roles:
                self._actor(name, role, [*argv, "--planner", self.planner, "--port", str(_free_port())], index)
            self._await_planner_ready()
        except BaseException:
            self.stop()
            raise
        return self.planner

    def _actor(self, name: str, role: str, argv: list[str], index: int | None = None) -> RayChild:
        import ray
        placement = actor_options(self.cfg, role, index)
        options = {**placement, "max_restarts": -1, "max_task_retries": -1, "name": f"overlord-{name}",
                   "lifetime": None}
        cls = ray.remote(type(role, (_Role,), {}))
        advertise_node = self.cfg.network.host in WILDCARDS and not self.cfg.network.advertise
        actor = cls.options(**options).remote(role, argv, {SECRET_ENV: self.secret}, advertise_node)
        location, pid = ray.get(actor.where.remote(), timeout=self.startup_timeout)
        child = RayChild(name, actor, location, pid, placement)
        self.children.append(child)
        return child

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Kill one role's actor process (``kill -9``); Ray restarts it on the same address."""
        child = self.child(name)
        os.kill(child.pid, sig)
        child.restarts.append(time.time())
        return child.pid

    def wait_restarted(self, name: str, restarts: int = 1, timeout: float = 60.0) -> None:
        import ray
        child = self.child(name)
        location, child.pid = ray.get(child.actor.where.remote(), timeout=timeout)
        assert location == child.location, f"{name} came back at {location}, not {child.location}"

    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    def stop(self, timeout: float = 10.0) -> None:
        import ray
        for child in reversed(self.children):
            try:
                ray.kill(child.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.children.clear()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()


def _free_port() -> int:
    """A port to pin a role to, so that Ray's restart of it comes back on the same address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
