"""The root of this project's errors: ``except OverlordError`` catches every error the package
raises on purpose, each also a subclass of the matching builtin (a ``ConfigError`` is a
``ValueError``), so a handler of the builtin catches it too. The balance package (``core/balance/``) is
self-contained and keeps its own (``CapacityError``, ``UnknownName``: ValueErrors).
"""
from __future__ import annotations


class OverlordError(Exception):
    """Any error flight_overlord raises on purpose."""


class ConfigError(OverlordError, ValueError):
    """An invalid configuration; the message names the key or file that is wrong. (Defined here, not
    in ``config``, so that a trainer's client can raise and catch it without importing the config
    parser and what it pulls in: image decoders, Parquet, file systems.)"""


class BackgroundFailure(OverlordError, RuntimeError):
    """A role's background work (planning, assembly) failed: every call waiting on it gets this,
    with the original exception kept as ``cause`` (and ``__cause__``)."""

    def __init__(self, message: str, cause: BaseException):
        super().__init__(message)
        self.cause = cause
        self.__cause__ = cause

    @classmethod
    def of(cls, what: str, exc: BaseException) -> "BackgroundFailure":
        return cls(f"{what}: {type(exc).__name__}: {exc}", exc)


class WaitTimedOut(OverlordError, TimeoutError):
    """A server-side wait for data ran out of time: the answer is still coming, the caller asks again
    (a Flight adapter answers it as ``FlightTimedOutError``)."""


class Busy(OverlordError, RuntimeError):
    """Too many calls already wait on this server: retry later (answered as a server error)."""


class Fenced(OverlordError, RuntimeError):
    """This process was replaced (a newer process claimed its role, ``fence.py``): it serves and
    journals nothing more."""
