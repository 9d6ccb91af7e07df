"""Local deployment: every role as its own process on this machine, on loopback ports.

Each child is ``python -m flight_overlord.deploy.cli serve ROLE ...`` (the same command a manual
deployment runs), announces its address in a ready file, and logs to ``run_dir/logs``.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.flight as fl

from .. import wire
from ..config import Config, load_config


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    ready_file: Path
    log_path: Path


class LocalCluster:
    """Start with ``start()`` (or as a context manager); ``planner`` is then the Planner's address."""

    def __init__(self, config_path: str | os.PathLike, *, startup_timeout: float = 120.0):
        self.config_path = Path(config_path).resolve()
        self.cfg: Config = load_config(self.config_path)  # fail fast, before any process starts
        self.startup_timeout = startup_timeout
        self.children: list[Child] = []
        self.planner: str | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix="overlord-ready-"))

    def start(self) -> str:
        try:
            planner = self._spawn("planner", ["planner"])
            self.planner = self._await_ready([planner])[0]
            children = [self._spawn(f"loader-{s.name}-{a}",
                                    ["loader", "--source", s.name, "--actor", str(a), "--planner", self.planner])
                        for s in self.cfg.sources for a in range(s.loaders)]
            children += [self._spawn(f"constructor-{c}", ["constructor", "--index", str(c), "--planner", self.planner])
                         for c in range(self.cfg.num_constructors)]
            self._await_ready(children)
            self._await_planner_ready()
        except BaseException:
            self.stop()
            raise
        return self.planner

    def _spawn(self, name: str, args: list[str]) -> Child:
        logs = self.cfg.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        ready_file = self._tmp / f"{name}.ready"
        log_path = logs / f"{name}.log"
        cmd = [sys.executable, "-m", "flight_overlord.deploy.cli", "serve", *args,
               "--config", str(self.config_path), "--ready-file", str(ready_file)]
        with open(log_path, "w") as log_file:
            process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        child = Child(name, process, ready_file, log_path)
        self.children.append(child)
        return child

    def _await_ready(self, children: list[Child]) -> list[str]:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            for child in children:
                if child.process.poll() is not None:
                    raise RuntimeError(f"{child.name} exited with code {child.process.returncode} during start-up:\n"
                                       + _tail(child.log_path))
            if all(c.ready_file.exists() for c in children):
                return [c.ready_file.read_text() for c in children]
            if time.monotonic() > deadline:
                late = [c.name for c in children if not c.ready_file.exists()]
                raise TimeoutError(f"not ready after {self.startup_timeout:.0f}s: {', '.join(late)}")
            time.sleep(0.05)

    def _await_planner_ready(self) -> None:
        client = fl.connect(self.planner)
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
        self.children.clear()
        shutil.rmtree(self._tmp, ignore_errors=True)  # the ready files

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError:
        return "(no log)"
