"""Bounded waits of a role's logic classes for their data (a step planned, a step assembled), with no
Flight in them: a wait that runs out raises :class:`~.errors.WaitTimedOut`, which the role's Flight
adapter answers as ``FlightTimedOutError`` (the client asks again, see ``wire.server.ask_again``)."""
from __future__ import annotations

import threading
from typing import Callable

from .errors import Busy, WaitTimedOut

MAX_WAITERS = 512  # blocking calls one server holds at once; more are refused, not queued


class Waiters:
    """The blocking calls of one server: each server's logic object owns one, so the roles of a
    one-process node (``deployment: single_node``) do not take each other's places."""

    def __init__(self, limit: int = MAX_WAITERS):
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)

    def wait_until(self, cond: threading.Condition, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait on ``cond`` (held by the caller) for ``predicate``; ``WaitTimedOut`` naming ``what`` after
        ``timeout``. At most ``limit`` calls wait at once (``Busy`` beyond), so a flood of waiting
        requests cannot hold every thread of the server."""
        if predicate():
            return
        if not self._slots.acquire(blocking=False):
            raise Busy(f"busy: {self.limit} calls are already waiting on this server (for {what}); retry later")
        try:
            if not cond.wait_for(predicate, timeout):
                raise WaitTimedOut(f"timed out after {timeout:.0f}s waiting for {what}")
        finally:
            self._slots.release()
