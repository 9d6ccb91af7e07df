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
import threading
import time
from typing import Callable

from ..config import LivenessConfig
from ..wire.security import Credentials
from ..wire.server import ANSWERED, SILENT, connect, probe

log = logging.getLogger(__name__)


class Liveness:
    """One probe thread per child of ``children`` (``launch.Child``) that serves: the standby Planner
    serves nothing until it takes over, and a child is asked only once its ready file is there (a
    starting process is not hung)."""

    def __init__(self, children: list, credentials: Credentials, config: LivenessConfig, *,
                 skip: Callable[[object], bool] = lambda child: False):
        self._children = children
        self._credentials = credentials
        self._config = config
        self._skip = skip
        self._stopping = threading.Event()

    def start(self) -> None:
        if not self._config.watched:
            return
        for child in self._children:
            if not self._skip(child):
                threading.Thread(target=self._watch, args=(child,), name=f"liveness-{child.name}", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()

    def _watch(self, child) -> None:
        held, process, client = time.monotonic(), None, None  # the last answer of the process watched
        try:
            while not self._stopping.wait(self._config.probe_seconds):
                if child.process is not process or not self._serving(child):  # restarted, or not serving yet
                    held, process, client = time.monotonic(), child.process, _closed(client)
                    continue
                client = client or connect(child.location, self._credentials)  # kept while it answers
                answer = probe(client, self._config.hung_seconds)
                if answer != ANSWERED:
                    client = _closed(client)  # a refusal is a death or a start: the supervisor sees to it
                if answer != SILENT:
                    held = time.monotonic()
                elif time.monotonic() - held >= self._config.hung_seconds and process.poll() is None:
                    self._kill(child, process, time.monotonic() - held)
        finally:
            _closed(client)

    @staticmethod
    def _serving(child) -> bool:
        return child.location is not None and child.ready_file is not None and child.ready_file.exists() \
            and child.process.poll() is None

    def _kill(self, child, process, silent: float) -> None:
        if self._stopping.is_set() or child.process is not process:
            return
        log.warning("%s (pid %d) has not answered for %.1fs: it is hung; killing it so that it is replaced",
                    child.name, process.pid, silent)
        process.kill()  # Popen's: never a reused pid (it knows whether its process was reaped)


def _closed(client) -> None:
    if client is not None:
        client.close()
