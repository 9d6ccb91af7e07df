"""One run's start-up, whatever runs the roles: ``Cluster`` over a small :class:`Backend`.

``Cluster.start()`` does what every deployment does, in order: check ``run_dir`` (``new`` / ``resume``
/ ``fresh``), write the run's cluster secret for its tools, auto-partition the sources onto loaders
(``loader.partition: auto``), check a resumed run's source edits, then start the roles of
:func:`~.topology.roles` (the Planner first, the others once its address is known) and wait until
the Planner saw every loader and constructor register. The backend only starts, signals, waits for
and stops role processes: local processes (``launch.LocalCluster``) or Ray actors
(``ray_backend.RayCluster``).
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Protocol

from .. import wire
from ..config import Config, ConfigError, load_config
from ..journal import read_journal
from ..source_catalog import ValidatedCatalogs
from ..wire.security import Credentials, Security, cluster_secret, secret_path, write_secret
from ..wire.server import connect
from . import planner_address
from .precheck import check_data
from .topology import RoleSpec, roles

log = logging.getLogger(__name__)
MODES = ("new", "resume", "fresh")


class Backend(Protocol):
    """What runs role processes. A handle it returns has ``name``, ``spec`` (its :class:`RoleSpec`),
    ``location`` (once ready) and ``restarts`` (when it was restarted, ``time.time()``)."""
    children: list
    hot_standbys: bool  # runs the config's standby Planner (else it restarts a Planner in place)
    one_process: bool  # runs a single_node run's roles in one process (``overlord serve node``)

    def open(self, cluster: "Cluster") -> int | None:
        """Before any role: connect to what runs them; the CPUs ``loader.hosts: auto`` may use (None: this
        machine's)."""

    def start_role(self, spec: RoleSpec, argv: list[str]): ...

    def wait_ready(self, handles: list, timeout: float) -> None:
        """Block until every handle serves, setting its ``location``."""

    def started(self) -> None:
        """Every role serves (a local backend starts supervising here)."""

    def kill(self, handle, sig: int) -> int: ...

    def wait_restarted(self, handle, restarts: int, timeout: float) -> None: ...

    def pids(self) -> list[int]: ...

    def stop(self, timeout: float) -> None: ...


class Cluster:
    """Start with ``start()`` (or as a context manager); ``planner`` is then the Planner's address.

    ``mode``: ``new`` refuses a ``run_dir`` that holds a previous run, ``resume`` continues it from
    its latest checkpoint, ``fresh`` moves it aside first (never deletes it).

    ``secret`` is the run's cluster secret and ``credentials`` what the run's own clients present
    (the secret, and the TLS settings of the config): ``wire.server.connect(location, cluster.credentials)``."""

    def __init__(self, config_path: str | os.PathLike, backend: Backend, *, mode: str = "new",
                 startup_timeout: float = 120.0):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
        self.config_path = Path(config_path).resolve()
        self.cfg: Config = load_config(self.config_path)  # fail fast, before any process starts
        self.secret, self._secret_source = cluster_secret(self.cfg, create=True)
        self.security = Security.from_config(self.cfg, self.secret)  # reads tokens and certificates: fail fast
        self.credentials: Credentials = self.security.credentials
        self.mode = mode
        self.startup_timeout = startup_timeout
        self.backend = backend
        self.planner: str | None = None
        self.moved_aside: Path | None = None
        self.validated = ValidatedCatalogs()  # the catalogs the latest start validated, for its roles

    @property
    def children(self) -> list:
        return self.backend.children

    def start(self) -> str:
        check_data(self.cfg)  # before anything is written: a bad column or transform is one line, no run_dir
        self._prepare_run_dir()
        before = set(os.listdir(self.cfg.run_dir)) if self.cfg.run_dir.is_dir() else set()
        if self._secret_source != "file":  # the tools and manual `overlord serve` of this run read it there
            write_secret(secret_path(self.cfg), self.secret)
        if self.cfg.loader.partition == "auto":
            self._partition()
        self.validated = self._check_sources()
        try:
            cpus = self.backend.open(self)
            planner, *others = roles(self.cfg, cpus=cpus, resume=self.mode == "resume",
                                     standbys=self.backend.hot_standbys, one_process=self.backend.one_process)
            port = planner_address.resume_port_args(self.cfg) if self.mode == "resume" else []
            first = self.backend.start_role(planner, [*planner.args, *port])
            self.backend.wait_ready([first], self.startup_timeout)
            self.planner = first.location
            planner_address.record(self.cfg, self.planner)
            started = [self.backend.start_role(s, [*s.args, "--standby-of" if s.standby else "--planner", self.planner])
                       for s in others]
            self.backend.wait_ready([h for h in started if not h.spec.standby], self.startup_timeout)  # a standby
            self._await_planner_ready()  # is ready once it takes over: not awaited
        except BaseException:
            self.stop()
            if self.mode != "resume":
                forget_failed_start(self.cfg.run_dir, before)
            raise
        self.backend.started()
        return self.planner

    def _prepare_run_dir(self) -> None:
        run_dir = self.cfg.run_dir
        if self.mode == "new" and holds_a_run(run_dir):
            raise ConfigError(f"run_dir {run_dir} holds a previous run: continue it with --resume, or start "
                              f"over with --fresh (which moves it aside, it deletes nothing)")
        if self.mode == "fresh" and run_dir.exists():
            self.moved_aside = move_aside(run_dir)
            log.info("moved the previous run aside to %s", self.moved_aside)

    def _check_sources(self) -> ValidatedCatalogs:
        """Before any role starts: a resume on an edited config refuses what it cannot honour. Returns
        the catalogs this start validated (a ``stat`` per file), which its roles then take as they are."""
        from ..planner.edits import check_sources
        from ..planner.shape import check_shape
        check_shape(self.cfg, resume=self.mode == "resume")
        validated = ValidatedCatalogs()
        for line in check_sources(self.cfg, resume=self.mode == "resume", validated=validated):
            log.info("resume: %s", line)
        return validated

    def _partition(self) -> None:
        """``loader.partition: auto``: profile (or reuse run_dir's profile) and plan; a resumed run keeps
        its plan (its loader journals are per actor). Every role then loads the config with the plan."""
        from ..loader.profile import partition, read_plan
        if not (self.mode == "resume" and read_plan(self.cfg) is not None):
            _, table = partition(self.cfg)
            log.info("loader.partition: auto\n%s", table)
        self.cfg = load_config(self.config_path)

    def _await_planner_ready(self) -> None:
        client = connect(self.planner, self.credentials)
        deadline = time.monotonic() + self.startup_timeout
        try:
            while not wire.call(client, "status")["ready"]:
                if time.monotonic() > deadline:
                    raise TimeoutError("the Planner did not see every loader and constructor register")
                time.sleep(0.05)
        finally:
            client.close()

    def child(self, name: str):
        for c in self.children:
            if c.name == name:
                return c
        raise KeyError(f"no role named {name!r} (roles: {', '.join(c.name for c in self.children)})")

    def loader_of(self, source: str, actor: int = 0, replica: int = 0):
        """The loader process hosting actor ``source[actor]`` (its shadow ``replica``), whatever
        ``loader.hosts`` grouped it with."""
        for c in self.children:
            if (source, actor) in c.spec.actors and c.spec.replica == replica:
                return c
        raise KeyError(f"no loader process hosts {source}[{actor}] replica {replica}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Signal one role (a test's ``kill -9``); the backend brings it back. Returns the pid."""
        return self.backend.kill(self.child(name), sig)

    def wait_restarted(self, name: str, restarts: int = 1, timeout: float = 60.0) -> None:
        """Block until role ``name`` was restarted ``restarts`` times and serves again."""
        self.backend.wait_restarted(self.child(name), restarts, timeout)

    def pids(self) -> list[int]:
        return self.backend.pids()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every role (constructors and loaders first)."""
        self.backend.stop(timeout)

    def __enter__(self) -> "Cluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def holds_a_run(run_dir: Path) -> bool:
    """A run was started in ``run_dir`` (its plan journal exists)."""
    return (Path(run_dir) / "plan-journal.jsonl").exists()


def forget_failed_start(run_dir: Path, before: set[str]) -> None:
    """A start that failed before its first planned step leaves nothing that refuses the retry: what it
    made in ``run_dir`` (journals without a plan, catalogs) is removed, its logs are kept for the reader."""
    journal = Path(run_dir) / "plan-journal.jsonl"
    if not journal.exists() or any(True for _ in read_journal(journal)):
        return
    for name in sorted(set(os.listdir(run_dir)) - before - {"logs"}):
        path = Path(run_dir) / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def move_aside(run_dir: Path) -> Path:
    """Rename ``run_dir`` to ``NAME.old-TIMESTAMP-PID`` beside it (nothing is deleted); return the new path."""
    run_dir = Path(run_dir)
    stem = f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    aside, n = run_dir.with_name(stem), 1
    while aside.exists():  # moved twice within a second by one process
        aside, n = run_dir.with_name(f"{stem}-{n}"), n + 1
    run_dir.rename(aside)
    return aside
