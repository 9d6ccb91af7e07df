"""Liveness of the local deployment's role processes: a hung role is killed, so the supervisor replaces it.

A process that dies refuses connections, and everything that talks to it moves on: constructors to a
loader's shadow, the standby to the Planner's address, trainers to the restarted constructor. A process
that hangs (SIGSTOP, a stuck read, a frozen VM) refuses nothing: its port still accepts connections
and nothing ever answers. So each serving role is asked a trivial question (``list_actions``, which its
gRPC threads answer beside any work it is doing) every ``liveness.probe_seconds``, with a deadline of
``liveness.hung_seconds``; one that lets that deadline pass is hung and gets SIGKILL (which reaches a
stopped process too). From there it is a dead process: the supervisor restarts it on its address (or
promotes the standby Planner), and its peers fail over as from a ``kill -9``. A process killed while
blocked in the kernel dies as soon as it returns, before it runs another instruction of its own; one
that cannot be killed (another host) is fenced (``fence.py``) by the replacement's claim.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Callable

import pyarrow.flight as fl

from ..config import LivenessConfig
from ..wire.security import Credentials
from ..wire.server import connect

log = logging.getLogger(__name__)


class Liveness:
    """One probe thread per child of ``children`` (``launch.Child``) that serves: the standby Planner
    serves nothing until it takes over, and a child is asked only once its ready file is there (a
    starting process is not hung). ``on_hung(child, silent_seconds)`` is told before the kill."""

    def __init__(self, children: list, credentials: Credentials, config: LivenessConfig, *,
                 skip: Callable[[object], bool] = lambda child: False,
                 on_hung: Callable[[object, float], None] = lambda child, seconds: None):
        self._children = children
        self._credentials = credentials
        self._config = config
        self._skip = skip
        self._on_hung = on_hung
        self._stopping = threading.Event()
        self.kills: list[tuple[str, float]] = []  # (child name, time.time()) of every hung process killed

    def start(self) -> None:
        if not self._config.watched:
            return
        for child in self._children:
            if not self._skip(child):
                threading.Thread(target=self._watch, args=(child,), name=f"liveness-{child.name}", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()

    def _watch(self, child) -> None:
        held, process = time.monotonic(), None  # the last answer of the process watched
        while not self._stopping.wait(self._config.probe_seconds):
            if child.process is not process or not self._serving(child):  # restarted, or not serving yet
                held, process = time.monotonic(), child.process
                continue
            if self._answers(child.location):
                held = time.monotonic()
            elif time.monotonic() - held >= self._config.hung_seconds and process.poll() is None:
                self._kill(child, process, time.monotonic() - held)

    @staticmethod
    def _serving(child) -> bool:
        return child.location is not None and child.ready_file is not None and child.ready_file.exists() \
            and child.process.poll() is None

    def _answers(self, location: str) -> bool:
        """False only for a process that accepted the call and let the deadline pass (a refusal is a death
        or a start, which the supervisor sees by itself)."""
        try:
            client = connect(location, self._credentials)
        except fl.FlightError:
            return True
        try:
            client.list_actions(options=fl.FlightCallOptions(timeout=self._config.hung_seconds))
            return True
        except fl.FlightTimedOutError:
            return False
        except Exception:  # noqa: BLE001 - refused, or an error: not a hang
            return True
        finally:
            client.close()

    def _kill(self, child, process, silent: float) -> None:
        if self._stopping.is_set() or child.process is not process:
            return
        log.warning("%s (pid %d) has not answered for %.1fs: it is hung; killing it so that it is replaced",
                    child.name, process.pid, silent)
        self._on_hung(child, silent)
        try:
            os.kill(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.kills.append((child.name, time.time()))
