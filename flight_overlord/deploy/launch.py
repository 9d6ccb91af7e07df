"""Local deployment: every role as its own process on this machine, on loopback ports, supervised.

Each child is ``python -m flight_overlord.deploy.cli serve ROLE ...`` (the same command a manual
deployment runs), announces its address in a ready file, and logs to ``run_dir/logs``. A child
that exits without being asked is restarted on the same address; it rebuilds its state from the
run's journals and snapshots (the Planner with ``--recover``), and the other roles ride out the
gap by retrying (or fail over to a shadow loader). A child that hangs is killed first (``liveness.py``).

The run's cluster secret (the config's ``security.cluster_secret_file``, else
``$OVERLORD_CLUSTER_SECRET``, else a fresh random one per start) reaches the children through their
environment, never their command line (``ps`` shows command lines), and is written 0600 to
``run_dir/secrets/cluster-secret`` for ``overlord serve`` processes and tools of the same run.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..wire.security import SECRET_ENV
from .cluster import Cluster
from .liveness import Liveness
from .topology import NODE, STANDBY, RoleSpec

log = logging.getLogger(__name__)


@dataclass
class Child:
    spec: RoleSpec
    args: list[str]  # the role, then its flags (``overlord serve`` takes them)
    log_path: Path
    process: subprocess.Popen | None = None  # set by ``Processes._spawn``, again at every restart
    ready_file: Path | None = None
    location: str | None = None
    restarts: list[float] = field(default_factory=list)  # when it was restarted (time.time())

    @property
    def name(self) -> str:
        return self.spec.name


class LocalCluster(Cluster):
    """Every role as its own process on this machine (:class:`Processes`); see :class:`Cluster`.
    ``supervise``: restart a child that exits without being asked."""

    def __init__(self, config_path: str | os.PathLike, *, mode: str = "new", supervise: bool = True,
                 startup_timeout: float = 120.0):
        super().__init__(config_path, Processes(supervise), mode=mode, startup_timeout=startup_timeout)


class Processes:
    """The local backend: one ``overlord serve ROLE`` child process per role, announcing its address in
    a ready file and logging to ``run_dir/logs``; supervised (restarted on its own address). A
    ``deployment: single_node`` run is one child, ``overlord serve node`` (``topology.roles``)."""
    hot_standbys = True
    one_process = True

    def __init__(self, supervise: bool = True):
        self.supervise = supervise
        self.children: list[Child] = []
        self._tmp = Path(tempfile.mkdtemp(prefix="overlord-ready-"))
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._cluster: Cluster | None = None
        self.liveness: Liveness | None = None  # kills a hung child, so that it is replaced (supervised runs)

    def open(self, cluster: Cluster) -> None:
        self._cluster = cluster  # its config path, run_dir and secret
        return None

    def start_role(self, spec: RoleSpec, argv: list[str]) -> Child:
        child = Child(spec, [spec.role, *argv], self._cluster.cfg.run_dir / "logs" / f"{spec.name}.log")
        self._spawn(child)
        self.children.append(child)
        return child

    def started(self) -> None:
        if self.supervise:
            threading.Thread(target=self._supervise, name="supervisor", daemon=True).start()
            self.liveness = Liveness(self.children, self._cluster.credentials, self._cluster.cfg.liveness,
                                     skip=lambda child: child.name == STANDBY)
            self.liveness.start()

    def _spawn(self, child: Child, *, restart: bool = False) -> None:
        """Start ``child``'s process (``restart``: again, on its own address; its log is appended to)."""
        cluster = self._cluster
        name = child.name
        # a standby's ready file becomes the Planner's when it takes over: each standby has its own
        ready_file = self._tmp / (f"{name}.ready" if name != STANDBY else f"{name}-{time.monotonic_ns()}.ready")
        extra = []
        if restart and name != STANDBY:  # same address; the Planner keeps the others' registrations
            ready_file.unlink(missing_ok=True)
            recover = ["--recover"] if child.spec.role in ("planner", NODE) else []
            extra = ["--port", child.location.rsplit(":", 1)[1], *recover]
        cmd = [sys.executable, "-m", "flight_overlord.deploy.cli", "serve", *child.args, *extra,
               "--config", str(cluster.config_path), "--ready-file", str(ready_file)]
        env = {**os.environ, SECRET_ENV: cluster.secret,  # never on the command line
               **cluster.validated.env()}  # the catalogs the start validated: a stat per file, once
        child.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(child.log_path, "a") as log_file:  # a restart appends: the crashed process's log stays
            child.process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=env)
        child.ready_file = ready_file
        if restart:
            child.restarts = child.restarts + [time.time()]

    def _supervise(self) -> None:
        """Restart every child that exits without being asked, on its own address."""
        while not self._stopping.wait(0.1):
            with self._lock:
                for child in self.children:
                    if child.process.poll() is not None and not self._stopping.is_set():
                        if child.name == "planner" and self._promote_standby(child):
                            continue
                        log.warning("%s exited with code %s; restarting it at %s", child.name,
                                    child.process.returncode, child.location)
                        self._spawn(child, restart=True)

    def _promote_standby(self, planner: Child) -> bool:
        """The Planner died and a live standby takes its address over: the standby's process is the
        Planner's from now on (a restart, to ``wait_restarted``), and a new standby follows it."""
        standby = next((c for c in self.children if c.name == STANDBY), None)
        if standby is None or standby.process.poll() is not None:
            return False
        log.warning("planner exited with code %s; its standby takes over %s", planner.process.returncode,
                    planner.location)
        planner.process, planner.ready_file = standby.process, standby.ready_file
        planner.restarts = planner.restarts + [time.time()]
        self._spawn(standby, restart=True)
        return True

    def kill(self, child: Child, sig: int = signal.SIGKILL) -> int:
        """Signal one role (a test's ``kill -9``); the supervisor brings it back. Returns the pid."""
        pid = child.process.pid
        os.kill(pid, sig)
        return pid

    def wait_restarted(self, child: Child, restarts: int = 1, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(child.restarts) < restarts or not child.ready_file.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{child.name} did not come back within {timeout:.0f}s:\n" + _tail(child.log_path))
            time.sleep(0.05)

    def wait_ready(self, children: list[Child], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for child in children:
                if child.process.poll() is not None:
                    raise RuntimeError(f"{child.name} exited with code {child.process.returncode} during start-up:\n"
                                       + _tail(child.log_path))
            if all(c.ready_file.exists() for c in children):
                for c in children:
                    c.location = c.ready_file.read_text()
                return
            if time.monotonic() > deadline:
                late = [c.name for c in children if not c.ready_file.exists()]
                raise TimeoutError(f"not ready after {timeout:.0f}s: {', '.join(late)}")
            time.sleep(0.05)

    def pids(self) -> list[int]:
        return [c.process.pid for c in self.children if c.process.poll() is None]

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every child (constructors and loaders first), then SIGKILL what is left."""
        self._stopping.set()
        if self.liveness is not None:
            self.liveness.stop()
        with self._lock:
            self._terminate(timeout)
        shutil.rmtree(self._tmp, ignore_errors=True)  # the ready files

    def _terminate(self, timeout: float) -> None:
        for child in reversed(self.children):
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in self.children:
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError:
        return "(no log)"
