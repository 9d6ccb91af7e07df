"""A constructor's plan requests on one long-lived ``do_exchange`` with the Planner (its "plans stream").

A ``plan`` action costs the Planner a whole Flight call per constructor and step (gRPC call set-up,
the auth middleware, the handler's dispatch: ~300 us of its CPU); a message on an open stream costs
a fraction of that. The protocol is lock-step, app_metadata only (JSON objects), on the descriptor
``("plans",)`` with the cluster secret:

- constructor -> Planner: a plan request (``PlanRequest``, action ``plan``'s body), or a positions
  report ``{"constructor", "positions"}`` (no ``step``);
- Planner -> constructor, one answer each: the constructor's plan of the step and of the steps after
  it that are planned already (at most ``PLANS_PER_ANSWER``), as one message (``answer_message``: the
  plans' ``encoded_plan`` rows back to back in one record batch, their headers as app_metadata; the
  stream's schema is ``encoded_plan``); the constructor then asks again only for the step after those,
  ``{"again": true}`` when it is not planned within the request's ``wait`` (ask again with fresh
  positions), ``{"ok": true}`` to a report, or ``{"error": MESSAGE}`` (a bad request: the stream
  stays open); these three as app_metadata only.

The Planner's handler blocks reading the next message, and a Flight server's shutdown waits for its
handlers: so a constructor that waits for its trainers reports its positions at least every
``POSITIONS_SECONDS`` (``PlanChannel.ask`` with a report), and the handler ends as soon as the Planner
stops.

The ``plan`` action is the same exchange as one call, for stock clients and inspection: its body is one
message, answered by the same function as on the stream with one constructor plan at most (``action_answer``:
the plan as one JSON object, ``ConstructorPlan.to_wire``, or ``{"ok": true}``; "again" is the call's time-out).
"""
from __future__ import annotations

import threading
from typing import Callable

import pyarrow as pa
import pyarrow.flight as fl

from ..errors import WaitTimedOut
from . import decode, encode
from .plan import ConstructorPlan, EncodedPlan, answer_message, encoded_plan_schema, read_answer_message
from .server import client_error, decode_body

PLANS = "plans"
# How stale a constructor's stream positions may be at the Planner, both ways one bound: a waiting
# constructor reports them this often, and the Planner holds a plan request at most this long (the
# positions it brought may be what planning waits for), then the constructor asks again with fresh
# ones. It also bounds how long the Planner's shutdown waits for a plans stream's handler.
POSITIONS_SECONDS = 0.5
AGAIN = encode({"again": True})
# Constructor plans in one answer: the asked step's and the next one's when it is planned, so that a constructor asks
# (and the Planner answers) about once every other step: the plans stream's messages were most of the
# Planner's CPU per step after planning itself.
PLANS_PER_ANSWER = 2
# Steps the Planner plans past the trainers' prefetch, so that an ask finds the next step planned too: a
# constructor that asks every other step reports its positions every other step, up to two steps old.
PLAN_AHEAD = 2
# errors that are the Planner's answer, not a broken stream: the constructor does not reconnect on them
_ANSWERS = (fl.FlightServerError, fl.FlightUnauthenticatedError, fl.FlightUnauthorizedError)


def check_descriptor(descriptor: fl.FlightDescriptor) -> None:
    parts = [p.decode() if isinstance(p, bytes) else p for p in (descriptor.path or [])]
    if parts != [PLANS]:
        raise KeyError(f"unknown do_exchange descriptor {parts or descriptor.command!r}: this Planner exchanges "
                       f"only ({PLANS!r},), a constructor's plans stream")


def serve_plans(reader, writer, answer: Callable[[dict], "dict | list[EncodedPlan]"],
                stopping: Callable[[], bool]) -> None:
    """The Planner's side: one answer per message until the constructor closes the stream or the Planner
    stops. ``answer(body)``: constructor plans of consecutive steps, or a JSON object; its ``WaitTimedOut`` is
    ``{"again": true}``, any other error ``{"error": ...}`` (said as a handler's error would be)."""
    writer.begin(encoded_plan_schema())
    while not stopping():
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return
        try:
            reply = answer(_message(chunk))
            reply = answer_message(reply) if isinstance(reply, list) else encode(reply)
        except WaitTimedOut:
            reply = AGAIN
        except Exception as exc:  # noqa: BLE001 - a bad request is answered; the stream stays up
            if stopping():  # failed because the Planner stops: the constructor asks again (it, or its successor)
                return
            reply = encode({"error": str(client_error(exc, "the plans stream"))})
        if isinstance(reply, tuple):  # constructor plans: (header, rows)
            header, rows = reply
            writer.write_with_metadata(rows, header)
        else:
            writer.write_metadata(reply)


def action_answer(reply: "dict | list[EncodedPlan]") -> dict:
    """An answer of the plans stream as the ``plan`` action's: the asked step's constructor plan as one JSON object."""
    return reply[0].to_wire() if isinstance(reply, list) else reply


def _message(chunk) -> dict:
    if chunk.data is not None or chunk.app_metadata is None:
        raise ValueError("malformed plans message: send a JSON object as app_metadata only (no record batch)")
    return decode_body(chunk.app_metadata.to_pybytes(), "plans message")


class PlanChannel:
    """The constructor's side: one open plans stream, reopened on the next ask after it broke."""

    def __init__(self):
        self._client: fl.FlightClient | None = None
        self._writer = self._reader = None
        self._closed = False  # for good: this constructor stops
        # opening a stream and a final close (another thread) exclude each other: a stream opened after
        # the final close would hold the Planner's shutdown
        self._lock = threading.Lock()

    def ask(self, client: fl.FlightClient, body: dict) -> "dict | list[ConstructorPlan]":
        """Send ``body`` on ``client``'s plans stream (opened on first use) and return the answer, decoded
        (constructor plans: their ``ConstructorPlan``s, the asked step's first). Raises ``FlightTimedOutError`` for
        "again" (``ask_again`` asks again), ``FlightServerError`` for an error answer, and
        ``FlightUnavailableError`` when the stream broke (``call_any`` reconnects)."""
        with self._lock:
            if self._closed:
                raise fl.FlightUnavailableError("the plans stream is closed: this constructor stops")
            if client is not self._client:
                _end(self._swap(), final=False)
                self._writer, self._reader = client.do_exchange(fl.FlightDescriptor.for_path(PLANS))
                self._client = client
            writer, reader = self._writer, self._reader  # ``close(final=True)`` may come from another thread
        try:
            writer.write_metadata(encode(body))
            chunk = reader.read_chunk()
        except _ANSWERS:
            self.close()
            raise
        except (StopIteration, fl.FlightError, pa.ArrowException, OSError) as exc:
            self.close()
            raise fl.FlightUnavailableError(f"the Planner's plans stream ended ({exc or 'closed'})") from None
        if chunk.app_metadata is None:  # every answer carries its header: a stream out of step, opened afresh
            self.close()
            raise fl.FlightUnavailableError("the Planner's answer on the plans stream had no header (app_metadata)")
        if chunk.data is not None:
            return read_answer_message(chunk.app_metadata.to_pybytes(), chunk.data)
        reply = decode(chunk.app_metadata.to_pybytes(), "the Planner's answer on the plans stream")
        if reply.get("again") is True:
            raise fl.FlightTimedOutError("not planned yet: ask again with fresh positions")
        if "error" in reply:
            raise fl.FlightServerError(str(reply["error"]))
        return reply

    def close(self, final: bool = False) -> None:
        """End the stream: the Planner's handler ends once it answered what it holds (closing the client
        would not end it). ``final`` (a stopping constructor, from any thread): never open another, and
        do not wait for the Planner's last answer."""
        with self._lock:
            self._closed = self._closed or final
            writer = self._swap()
        _end(writer, final)

    def _swap(self):
        """Forget the open stream (under the lock); its writer, to end."""
        writer, self._client, self._writer, self._reader = self._writer, None, None, None
        return writer


def _end(writer, final: bool) -> None:
    if writer is not None:
        try:
            writer.done_writing()
            if not final:
                writer.close()
        except Exception:  # noqa: BLE001 - a broken stream: nothing left to close cleanly
            pass
