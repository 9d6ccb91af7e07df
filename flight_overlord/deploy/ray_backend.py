"""The Ray backend: the roles of ``topology.roles(cfg)`` as Ray actors, started by the same
``cluster.Cluster`` as the local backend (so ``loader.partition: auto`` plans at start-up here too),
each hosting the same Flight server as a process of ``LocalCluster`` does, on a fixed port so that Ray's
restart of a killed actor comes back on the same address and rebuilds from the run's journals (the Planner
with ``--recover``).

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
import ipaddress
import os
import signal
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

import psutil

from ..config import Config, ConfigError
from ..role_process import WILDCARDS
from ..wire.security import SECRET_ENV
from .cluster import Cluster
from .topology import RoleSpec

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
    mesh = cfg.mesh
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

    def where(self) -> tuple[str, int, str]:
        """Its address, process id, and the IP of the node it runs on."""
        import ray
        return self.location, os.getpid(), ray.util.get_node_ip_address()


@dataclass
class RayChild:
    name: str
    actor: object
    spec: RoleSpec
    placement: dict = field(default_factory=dict)  # the placement options it was started with
    location: str | None = None
    pid: int | None = None
    node: str | None = None  # the IP of the node its process runs on
    restarts: list[float] = field(default_factory=list)


class RayCluster(Cluster):
    """The roles as Ray actors (:class:`RayActors`); see :class:`~.cluster.Cluster`. ``address``: the
    Ray cluster to join (``auto``, ``HOST:PORT``), else a local Ray is started."""

    def __init__(self, config_path, *, address: str | None = None, mode: str = "new", startup_timeout: float = 120.0):
        super().__init__(config_path, RayActors(address), mode=mode, startup_timeout=startup_timeout)

    @property
    def address(self) -> str | None:
        return self.backend.address


class RayActors:
    """The Ray backend: one actor per role on a fixed port (a restart by Ray comes back on the same
    address, so it needs no standby Planner); Ray restarts what dies, nothing here supervises."""
    hot_standbys = False
    one_process = False  # each role its own actor: Ray places and restarts them one by one

    def __init__(self, address: str | None = None):
        self.address = address
        self.children: list[RayChild] = []
        self._started_ray = False
        self._cluster: Cluster | None = None

    def open(self, cluster: Cluster) -> int | None:
        """Join (or start) Ray and check the placement's resources; ``loader.hosts: auto`` counts its CPUs."""
        import ray
        self._cluster = cluster
        cfg = cluster.cfg
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if not ray.is_initialized():
            local = {} if self.address else {"num_cpus": os.cpu_count()}
            if not self.address and cfg.network.host not in WILDCARDS:
                local["_node_ip_address"] = cfg.network.host
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False, configure_logging=False,
                     **local)
            self._started_ray = True
        resources = ray.cluster_resources()
        check_resources(cfg, resources)
        return int(resources.get("CPU", 0)) or None

    def start_role(self, spec: RoleSpec, argv: list[str]) -> RayChild:
        import ray
        cluster = self._cluster
        placement = actor_options(cluster.cfg, spec.role, spec.index)
        options = {**placement, "max_restarts": -1, "max_task_retries": -1, "name": f"overlord-{spec.name}",
                   "lifetime": None}
        cls = ray.remote(type(spec.role, (_Role,), {}))
        advertise_node = cluster.cfg.network.host in WILDCARDS and not cluster.cfg.network.advertise
        argv = [*argv, "--config", str(cluster.config_path), *pinned_port_args(cluster.cfg, spec.role, argv)]
        actor = cls.options(**options).remote(spec.role, argv, {SECRET_ENV: cluster.secret}, advertise_node)
        child = RayChild(spec.name, actor, spec, placement)
        self.children.append(child)
        return child

    def wait_ready(self, children: list[RayChild], timeout: float) -> None:
        import ray
        answers = ray.get([c.actor.where.remote() for c in children], timeout=timeout)
        for child, (location, pid, node) in zip(children, answers):
            child.location, child.pid, child.node = location, pid, node

    def started(self) -> None:
        pass  # Ray restarts a dead actor (max_restarts=-1)

    def kill(self, child: RayChild, sig: int = signal.SIGKILL) -> int:
        """Kill one role's actor process (``kill -9``); Ray restarts it on the same address."""
        os.kill(child.pid, sig)
        child.restarts.append(time.time())
        return child.pid

    def wait_restarted(self, child: RayChild, restarts: int = 1, timeout: float = 60.0) -> None:
        import ray
        location, child.pid, child.node = ray.get(child.actor.where.remote(), timeout=timeout)
        assert location == child.location, f"{child.name} came back at {location}, not {child.location}"

    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    def stop(self, timeout: float = 10.0) -> None:
        """Kill every actor and wait (up to ``timeout``) for the processes on this node to be gone: ``ray.kill``
        returns before they are, and a resume right after needs the Planner's port free again."""
        import ray
        for child in reversed(self.children):
            try:
                ray.kill(child.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        here = ray.util.get_node_ip_address() if ray.is_initialized() else None
        _wait_gone([c.pid for c in self.children if c.pid is not None and c.node == here], timeout)
        self.children.clear()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()


def _wait_gone(pids: list[int], timeout: float) -> None:
    processes = []
    for pid in pids:
        try:
            processes.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=timeout)


def pinned_port_args(cfg: Config, role: str, argv: list[str]) -> list[str]:
    """The ``--port`` a role's actor is pinned to, unless ``argv`` names one already (a resume's Planner comes
    back on the run's previous port, where trainers look: ``planner_address.resume_port_args``). The Planner
    takes ``network.planner_port`` when the config fixes it; anything else a free port."""
    if "--port" in argv:
        return []
    if role == "planner" and cfg.network.planner_port:
        return ["--port", str(cfg.network.planner_port)]
    return ["--port", str(_free_port())]


def _free_port() -> int:
    """A port to pin a role to, so that Ray's restart of it comes back on the same address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
