"""Local deployment: every role as its own process on this machine, on loopback ports, supervised.

Each child is ``python -m flight_overlord.deploy.cli serve ROLE ...`` (the same command a manual
deployment runs), announces its address in a ready file, and logs to ``run_dir/logs``. A child
that exits without being asked is restarted on the same address; it rebuilds its state from the
run's journals and snapshots (the Planner with ``--recover``), and the other roles ride out the
gap by retrying (or fail over to a shadow loader).

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

from .. import wire
from ..config import Config, ConfigError, load_config
from ..wire.security import SECRET_ENV, Credentials, Security, cluster_secret, secret_path, write_secret
from ..wire.server import connect

log = logging.getLogger(__name__)
MODES = ("new", "resume", "fresh")
STANDBY = "planner-standby"  # the hot standby Planner's child name (planner.standbys: 1)
# Loader processes use the system allocator (docs/methods/memory.md): set before pyarrow loads.
LOADER_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


@dataclass
class Child:
    name: str
    args: list[str]
    process: subprocess.Popen
    ready_file: Path
    log_path: Path
    location: str | None = None
    restarts: list[float] = field(default_factory=list)  # when it was restarted (time.time())


class LocalCluster:
    """Start with ``start()`` (or as a context manager); ``planner`` is then the Planner's address.

    ``mode``: ``new`` refuses a ``run_dir`` that holds a previous run, ``resume`` continues it from
    its latest checkpoint, ``fresh`` moves it aside first (never deletes it).

    ``secret`` is the run's cluster secret and ``credentials`` what the run's own clients present
    (the secret, and the TLS settings of the config): ``wire.server.connect(location, cluster.credentials)``."""

    def __init__(self, config_path: str | os.PathLike, *, mode: str = "new", supervise: bool = True,
                 startup_timeout: float = 120.0):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
        self.config_path = Path(config_path).resolve()
        self.cfg: Config = load_config(self.config_path)  # fail fast, before any process starts
        self.secret, self._secret_source = cluster_secret(self.cfg, create=True)
        self.security = Security.from_config(self.cfg, self.secret)  # reads tokens and certificates: fail fast
        self.credentials: Credentials = self.security.credentials
        self.mode = mode
        self.supervise = supervise
        self.startup_timeout = startup_timeout
        self.children: list[Child] = []
        self.planner: str | None = None
        self.moved_aside: Path | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix="overlord-ready-"))
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> str:
        self._prepare_run_dir()
        if self._secret_source != "file":  # the tools and manual `overlord serve` of this run read it there
            write_secret(secret_path(self.cfg), self.secret)
        if self.cfg.loader.partition == "auto":
            self._partition()
        self._check_sources()
        try:
            planner = self._spawn("planner", ["planner", *(["--resume"] if self.mode == "resume" else [])])
            self.planner = self._await_ready([planner])[0]
            if self.cfg.planner.standbys:  # ready once it takes over: not awaited
                self._spawn(STANDBY, ["planner", "--standby-of", self.planner])
            children = [self._spawn(name + (f"-shadow{r}" if r else ""),
                                    ["loader", "--actors", ",".join(f"{s}:{a}" for s, a in actors), "--replica", str(r),
                                     "--planner", self.planner])
                        for name, actors in loader_hosts(self.cfg) for r in range(1 + self.cfg.loader.shadows)]
            children += [self._spawn(f"constructor-{c}", ["constructor", "--index", str(c), "--planner", self.planner])
                         for c in range(self.cfg.num_constructors)]
            self._await_ready(children)
            self._await_planner_ready()
        except BaseException:
            self.stop()
            raise
        if self.supervise:
            threading.Thread(target=self._supervise, name="supervisor", daemon=True).start()
        return self.planner

    def _prepare_run_dir(self) -> None:
        run_dir = self.cfg.run_dir
        if self.mode == "new" and holds_a_run(run_dir):
            raise ConfigError(f"run_dir {run_dir} holds a previous run: continue it with --resume, or start "
                              f"over with --fresh (which moves it aside, it deletes nothing)")
        if self.mode == "fresh" and run_dir.exists():
            self.moved_aside = move_aside(run_dir)
            log.info("moved the previous run aside to %s", self.moved_aside)

    def _check_sources(self) -> None:
        """Before any role starts: a resume on an edited config refuses what it cannot honour."""
        from ..planner.edits import check_sources
        for line in check_sources(self.cfg, resume=self.mode == "resume"):
            log.info("resume: %s", line)

    def _partition(self) -> None:
        """``loader.partition: auto``: profile (or reuse run_dir's profile) and plan; a resumed run keeps
        its plan (its loader journals are per actor). Every child then loads the config with the plan."""
        from ..loader.profile import partition, read_plan
        if not (self.mode == "resume" and read_plan(self.cfg) is not None):
            _, table = partition(self.cfg)
            log.info("loader.partition: auto\n%s", table)
        self.cfg = load_config(self.config_path)

    def _spawn(self, name: str, args: list[str], *, restart_of: Child | None = None) -> Child:
        logs = self.cfg.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        # a standby's ready file becomes the Planner's when it takes over: each standby has its own
        ready_file = self._tmp / (f"{name}.ready" if name != STANDBY else f"{name}-{time.monotonic_ns()}.ready")
        log_path = logs / f"{name}.log"
        extra = []
        if restart_of is not None and name != STANDBY:  # same address; the Planner keeps the others' registrations
            ready_file.unlink(missing_ok=True)
            extra = ["--port", restart_of.location.rsplit(":", 1)[1]] + (["--recover"] if name == "planner" else [])
        cmd = [sys.executable, "-m", "flight_overlord.deploy.cli", "serve", *args, *extra,
               "--config", str(self.config_path), "--ready-file", str(ready_file)]
        env = {**os.environ, SECRET_ENV: self.secret}  # never on the command line
        if args[0] == "loader":  # mimalloc keeps each read-ahead thread's freed pages: ~2x a host's PSS
            env.setdefault(LOADER_POOL_ENV, "system")
        with open(log_path, "a") as log_file:  # a restart appends: the crashed process's log stays
            process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env)
        if restart_of is not None:
            restart_of.process, restart_of.restarts = process, restart_of.restarts + [time.time()]
            restart_of.ready_file = ready_file
            return restart_of
        child = Child(name, args, process, ready_file, log_path)
        self.children.append(child)
        return child

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
                        self._spawn(child.name, child.args, restart_of=child)

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
        self._spawn(STANDBY, standby.args, restart_of=standby)
        return True

    def child(self, name: str) -> Child:
        for c in self.children:
            if c.name == name:
                return c
        raise KeyError(f"no role named {name!r} (roles: {', '.join(c.name for c in self.children)})")

    def loader_of(self, source: str, actor: int = 0, replica: int = 0) -> Child:
        """The loader process hosting actor ``source[actor]`` (its shadow ``replica``), whatever
        ``loader.hosts`` grouped it with."""
        for c in self.children:
            if (c.args[0] == "loader" and f"{source}:{actor}" in c.args[c.args.index("--actors") + 1].split(",")
                    and c.args[c.args.index("--replica") + 1] == str(replica)):
                return c
        raise KeyError(f"no loader process hosts {source}[{actor}] replica {replica}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Signal one role (a test's ``kill -9``); the supervisor brings it back. Returns the pid."""
        pid = self.child(name).process.pid
        os.kill(pid, sig)
        return pid

    def wait_restarted(self, name: str, restarts: int = 1, timeout: float = 60.0) -> None:
        """Block until role ``name`` was restarted ``restarts`` times and serves again."""
        child = self.child(name)
        deadline = time.monotonic() + timeout
        while len(child.restarts) < restarts or not child.ready_file.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not come back within {timeout:.0f}s:\n" + _tail(child.log_path))
            time.sleep(0.05)

    def _await_ready(self, children: list[Child]) -> list[str]:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            for child in children:
                if child.process.poll() is not None:
                    raise RuntimeError(f"{child.name} exited with code {child.process.returncode} during start-up:\n"
                                       + _tail(child.log_path))
            if all(c.ready_file.exists() for c in children):
                for c in children:
                    c.location = c.ready_file.read_text()
                return [c.location for c in children]
            if time.monotonic() > deadline:
                late = [c.name for c in children if not c.ready_file.exists()]
                raise TimeoutError(f"not ready after {self.startup_timeout:.0f}s: {', '.join(late)}")
            time.sleep(0.05)

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

    def pids(self) -> list[int]:
        return [c.process.pid for c in self.children if c.process.poll() is None]

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every child (constructors and loaders first), then SIGKILL what is left."""
        self._stopping.set()
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

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# ``loader.hosts: auto`` puts up to this many actors in one process: an actor spends most of its time in
# Arrow's reads and decompression (GIL released), and a process costs ~64 MiB before any data, so four
# per process keeps that under 16 MiB a source while one process per CPU still bounds the parallelism.
ACTORS_PER_HOST = 4


def holds_a_run(run_dir: Path) -> bool:
    """A run was started in ``run_dir`` (its plan journal exists)."""
    return (Path(run_dir) / "plan-journal.jsonl").exists()


def move_aside(run_dir: Path) -> Path:
    """Rename ``run_dir`` to ``NAME.old-TIMESTAMP-PID`` beside it (nothing is deleted); return the new path."""
    run_dir = Path(run_dir)
    stem = f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    aside, n = run_dir.with_name(stem), 1
    while aside.exists():  # moved twice within a second by one process
        aside, n = run_dir.with_name(f"{stem}-{n}"), n + 1
    run_dir.rename(aside)
    return aside


def machine_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def loader_hosts(cfg: Config, cpus: int | None = None) -> list[tuple[str, list[tuple[str, int]]]]:
    """(process name, the loader actors it hosts). ``cpus`` (default: this machine's) bounds the
    processes of ``loader.hosts: auto``. With ``loader.scaling`` a source's idle actors
    (``loaders`` .. ``max_actors`` - 1, activated by a live reshard) live in the process of its actor
    ``a % loaders``: pre-provisioned, so no process is started mid-run, every actor has its journal and
    shadows from the start, and an idle one costs its catalog, not a process."""
    hosts = _hosts_of_configured_actors(cfg, cpus)
    where = {actor: i for i, (_, actors) in enumerate(hosts) for actor in actors}
    for s in cfg.sources:
        for a in range(s.loaders, cfg.provisioned_actors(s)):
            hosts[where[(s.name, a % s.loaders)]][1].append((s.name, a))
    return hosts


def _hosts_of_configured_actors(cfg: Config, cpus: int | None) -> list[tuple[str, list[tuple[str, int]]]]:
    """(process name, the loader actors it hosts): with ``loader.hosts: N`` the actors dealt round robin
    onto N processes (``loader-hostH``); ``auto`` (the default) is N = min(ceil(actors / ACTORS_PER_HOST),
    CPUs); 0, or N >= the
    actors, is one process per actor (``loader-SOURCE-ACTOR``). Which process hosts an actor changes
    nothing in the streams: the read order is per source, not per process."""
    if cfg.loader.groups:  # loader.partition: auto: the plan's hosts (clusters of sources by cost)
        return [(f"loader-host{h}", list(group)) for h, group in enumerate(cfg.loader.groups)]
    actors = [(s.name, a) for s in cfg.sources for a in range(s.loaders)]
    hosts = cfg.loader.hosts
    if hosts == "auto":
        hosts = min(-(-len(actors) // ACTORS_PER_HOST), cpus or machine_cpus())
    if not hosts or hosts >= len(actors):
        return [(f"loader-{s}-{a}", [(s, a)]) for s, a in actors]
    return [(f"loader-host{h}", actors[h::hosts]) for h in range(hosts)]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError:
        return "(no log)"
