"""The Ray backend: the same roles as Ray actors, each hosting the same Flight server as a process of
``LocalCluster`` does, on a fixed port so that Ray's restart of a killed actor comes back on the same
address and rebuilds from the run's journals (the Planner with ``--recover``).

    overlord up --backend ray CONFIG [--address auto|HOST:PORT]

Without ``--address`` a local Ray is started with this machine's CPUs (usage reporting off, no
dashboard); with one, the roles join that cluster. Every actor asks for a fraction of a CPU, so many
fit on a node; loader actors are spread over the nodes. The config file, the data (local paths on a
shared file system, or URIs) and the ``run_dir`` must be reachable from every node.
"""
from __future__ import annotations

import importlib
import os
import signal
import socket
import time
from dataclasses import dataclass, field

from ..wire.security import SECRET_ENV, secret_path, write_secret
from .launch import LocalCluster, loader_hosts

ROLE_CPUS = 0.1  # per actor: the roles are I/O and numpy bound, and many share a node


class _Role:
    """One role in a Ray actor process. The class Ray runs is named after the role (``planner``,
    ``loader``, ``constructor``), so the process title Ray gives it (``ray::loader...``) names the role."""

    def __init__(self, role: str, argv: list[str], env: dict[str, str]):
        import ray
        os.environ.update(env)
        if role == "planner" and ray.get_runtime_context().was_current_actor_reconstructed:
            argv = [*argv, "--recover"]  # a restart of the Planner alone: keep the others' registrations
        self.server, self.location, _ = importlib.import_module(f"flight_overlord.{role}.server").start(argv)

    def where(self) -> tuple[str, int]:
        return self.location, os.getpid()


@dataclass
class RayChild:
    name: str
    actor: object
    location: str
    pid: int
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
        if self._secret_source != "file":  # the run's tools read it there, as with LocalCluster
            write_secret(secret_path(self.cfg), self.secret)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if not ray.is_initialized():
            local = {} if self.address else {"num_cpus": os.cpu_count(), "_node_ip_address": self.cfg.network.host}
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False, configure_logging=False,
                     **local)
            self._started_ray = True
        try:
            config = ["--config", str(self.config_path)]
            planner = self._actor("planner", "planner", [*config, "--port", str(_free_port()),
                                                          *(["--resume"] if self.mode == "resume" else [])])
            self.planner = planner.location
            roles = [(name + (f"-shadow{r}" if r else ""), "loader",
                      [*config, "--actors", ",".join(f"{s}:{a}" for s, a in actors), "--replica", str(r)])
                     for name, actors in loader_hosts(self.cfg) for r in range(1 + self.cfg.loader.shadows)]
            roles += [(f"constructor-{c}", "constructor", [*config, "--index", str(c)])
                      for c in range(self.cfg.num_constructors)]
            for name, role, argv in roles:
                self._actor(name, role, [*argv, "--planner", self.planner, "--port", str(_free_port())])
            self._await_planner_ready()
        except BaseException:
            self.stop()
            raise
        return self.planner

    def _actor(self, name: str, role: str, argv: list[str]) -> RayChild:
        import ray
        options = {"num_cpus": ROLE_CPUS, "max_restarts": -1, "max_task_retries": -1, "name": f"overlord-{name}",
                   "lifetime": None}
        if role == "loader":
            options["scheduling_strategy"] = "SPREAD"
        cls = ray.remote(type(role, (_Role,), {}))
        actor = cls.options(**options).remote(role, argv, {SECRET_ENV: self.secret})
        location, pid = ray.get(actor.where.remote(), timeout=self.startup_timeout)
        child = RayChild(name, actor, location, pid)
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
