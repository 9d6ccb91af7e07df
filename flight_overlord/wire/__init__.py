"""The wire between roles: JSON tickets and action bodies (any stock Flight client can read them).

Tickets and action bodies are small JSON objects, so any stock Flight client can read
them; the tickets for a rank's data carry the Planner's signature (``wire/security.py``), so
nobody can forge or alter them, and who may send what is checked per role. Bad requests raise
``ValueError`` (the client sees ``ArrowInvalid``) or ``KeyError`` (``ArrowKeyError``) with a message
naming what is wrong; the server
stays up because pyarrow turns handler exceptions into error statuses.
"""
from __future__ import annotations

import json
from typing import Any

import pyarrow.flight as fl


def encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


MAX_MESSAGE = 64 << 20  # bytes of one JSON ticket or action body (a step's sample list is far below)


def decode(raw: bytes, what: str) -> dict:
    """Parse a JSON object from a ticket or action body, or raise ValueError naming ``what``."""
    if len(raw) > MAX_MESSAGE:
        raise ValueError(f"malformed {what}: {len(raw):,} bytes, over the {MAX_MESSAGE:,} limit")
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise ValueError(f"malformed {what}: JSON nested too deep") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        why = exc.msg if hasattr(exc, "msg") else exc
        raise ValueError(f"malformed {what}: not a JSON object ({why}): {raw[:80]!r}") from None
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


def optional_field(obj: dict, name: str, kind: type, what: str, default: Any = None) -> Any:
    """``obj[name]`` checked as ``field`` does, or ``default`` when it is absent or null."""
    return field(obj, name, kind, what) if obj.get(name) is not None else default


def ticket(obj: dict) -> fl.Ticket:
    return fl.Ticket(encode(obj))


def call(client: fl.FlightClient, name: str, body: Any = None, *, timeout: float | None = None) -> Any:
    """Run one action and decode its single JSON result (None if the action returns nothing)."""
    options = fl.FlightCallOptions(timeout=timeout) if timeout else None
    results = list(client.do_action(fl.Action(name, encode(body if body is not None else {})), options))
    return json.loads(results[0].body.to_pybytes()) if results else None

