"""Flight plumbing shared by every role: JSON tickets and actions, a thin server base.

Tickets and action bodies are small JSON objects, so any stock Flight client can read
and forge them. Bad requests raise ``ValueError`` (the client sees ``ArrowInvalid``)
or ``KeyError`` (``ArrowKeyError``) with a message naming what is wrong; the server
stays up because pyarrow turns handler exceptions into error statuses.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow.flight as fl

log = logging.getLogger(__name__)


def encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def decode(raw: bytes, what: str) -> dict:
    """Parse a JSON object from a ticket or action body, or raise ValueError naming ``what``."""
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed {what}: not a JSON object ({exc.msg if hasattr(exc, 'msg') else exc}): {raw[:80]!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"malformed {what}: expected a JSON object, got {type(obj).__name__}")
    return obj


def field(obj: dict, name: str, kind: type, what: str) -> Any:
    """``obj[name]`` checked to be of ``kind``; ValueError naming the field otherwise."""
    if name not in obj:
        raise ValueError(f"malformed {what}: missing field {name!r}")
    value = obj[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"malformed {what}: field {name!r} must be an integer, got {value!r}")
    if not isinstance(value, kind):
        raise ValueError(f"malformed {what}: field {name!r} must be {kind.__name__}, got {value!r}")
    return value


def ticket(obj: dict) -> fl.Ticket:
    return fl.Ticket(encode(obj))


def call(client: fl.FlightClient, name: str, body: Any = None, *, timeout: float | None = None) -> Any:
    """Run one action and decode its single JSON result (None if the action returns nothing)."""
    options = fl.FlightCallOptions(timeout=timeout) if timeout else None
    results = list(client.do_action(fl.Action(name, encode(body if body is not None else {})), options))
    return json.loads(results[0].body.to_pybytes()) if results else None


def wait_until(cond: threading.Condition, predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait on ``cond`` (held by the caller) for ``predicate``; FlightTimedOutError naming ``what`` after ``timeout``."""
    if not cond.wait_for(predicate, timeout):
        raise fl.FlightTimedOutError(f"timed out after {timeout:.0f}s waiting for {what}")


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

