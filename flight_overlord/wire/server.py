"""The one Flight server base every role uses, its client pool and its lifecycle helpers."""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow.flight as fl

from . import decode, encode

log = logging.getLogger(__name__)


class ActionServer(fl.FlightServerBase):
    """A Flight server whose actions are methods named ``action_<name>(body: dict) -> JSON-able``."""

    def list_actions(self, context):
        return [(name[len("action_"):], (getattr(self, name).__doc__ or "").strip().split("\n")[0])
                for name in sorted(dir(self)) if name.startswith("action_")]

    def do_action(self, context, action):
        handler = getattr(self, f"action_{action.type}", None)
        if handler is None:
            known = ", ".join(name for name, _ in self.list_actions(context))
            raise KeyError(f"unknown action {action.type!r} (known: {known})")
        body = decode(action.body.to_pybytes() or b"{}", f"body of action {action.type!r}")
        result = handler(body)
        if result is not None:
            yield fl.Result(encode(result))


class ClientPool:
    """One reusable Flight client per location (clients are thread-safe)."""

    def __init__(self):
        self._clients: dict[str, fl.FlightClient] = {}
        self._lock = threading.Lock()

    def get(self, location: str) -> fl.FlightClient:
        with self._lock:
            if location not in self._clients:
                self._clients[location] = fl.connect(location)
            return self._clients[location]

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()


def location_of(server: fl.FlightServerBase, host: str) -> str:
    return f"grpc://{host}:{server.port}"


def serve(server: fl.FlightServerBase, location: str, ready_file: str | None) -> None:
    """Announce ``location`` (atomically, in ``ready_file``) and block until SIGINT/SIGTERM or shutdown."""
    log.info("serving at %s", location)
    if ready_file:
        tmp = Path(f"{ready_file}.tmp.{os.getpid()}")
        tmp.write_text(location)
        tmp.replace(ready_file)
    server.serve()  # returns on SIGINT/SIGTERM
    log.info("shutting down %s", location)
    server.shutdown()


def retry(fn: Callable[[], Any], *, attempts: int, delay: float, what: str) -> Any:
    """Call ``fn`` until it succeeds, for connection set-up races between starting processes."""
    for attempt in range(attempts):
        try:
            return fn()
        except fl.FlightUnavailableError:
            if attempt == attempts - 1:
                raise
            log.info("%s: not reachable yet, retrying", what)
            time.sleep(delay)

