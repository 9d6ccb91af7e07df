"""The one Flight server base every role uses, its client pool and its lifecycle helpers."""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow.flight as fl

from . import call, decode, encode

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



class RoleDown(ConnectionError):
    """Every replica of a role stayed unreachable for the whole retry window."""


def call_any(pool: "ClientPool", locations: list[str], fn: Callable[[fl.FlightClient], Any], *, what: str,
             timeout: float = 120.0, stop: Callable[[], bool] = lambda: False) -> Any:
    """``fn(client)`` on the first location that answers, the others in order on
    ``FlightUnavailableError``; all of them again with back-off until ``timeout``. This is how a
    role rides out a peer's restart (same address) or fails over to a shadow (the next one)."""
    deadline, delay, since = time.monotonic() + timeout, 0.05, time.time()
    while True:
        for location in locations:
            try:
                return fn(pool.get(location))
            except fl.FlightUnavailableError:
                continue
        if time.monotonic() > deadline or stop():
            raise RoleDown(f"{what}: unreachable at {', '.join(locations)} since "
                           f"{time.strftime('%H:%M:%S', time.localtime(since))} ({timeout:.0f}s)")
        time.sleep(delay)
        delay = min(1.0, delay * 2)


def register(planner: str, body: dict) -> None:
    """Announce this role to the Planner, waiting for it to come up (processes start in any order)."""
    client = fl.connect(planner)
    try:
        retry(lambda: call(client, "register", body), attempts=100, delay=0.2, what="planner")
    finally:
        client.close()
