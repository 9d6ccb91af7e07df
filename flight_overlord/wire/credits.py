"""A trainer's rank stream with credits: steps in flight to a rank bounded by its ``prefetch``.

A ``do_get`` of a rank ticket is flow-controlled by gRPC in bytes: with small steps, ~80 of them sat
in the transport's window, counted as served at the constructor (so released there) while the trainer
had not seen them. ``TrainerClient`` instead redeems the same rank ticket with ``do_exchange``
(descriptor: ``for_command(TICKET)``) and says, as app_metadata only (``{"upto": N}``), up to which
step (exclusive) the constructor may send; the constructor takes a step off its staging (and counts it
served) only once the credit allows it. The client gives ``prefetch + 1`` steps of credit at the start
and, after each step it queues, as much more as its queue has room, plus one: so steps sent and not yet
yielded to the training loop (queue and transport together) are at most ``prefetch + 1``.

The constructor's handler blocks reading the next credit, and a Flight server's shutdown waits for its
handlers: so a client that waits for room in its queue sends its credit again every
``HEARTBEAT_SECONDS`` (the handler then sees the server stopping). A stock client's ``do_get`` of the
rank ticket is unchanged (gRPC's window, no credit).
"""
from __future__ import annotations

from typing import Callable

import pyarrow.flight as fl

from . import decode, encode

HEARTBEAT_SECONDS = 1.0  # a waiting client repeats its credit this often (bounds the server's shutdown wait)


def credit_message(upto: int) -> bytes:
    return encode({"upto": int(upto)})


def credit_after(step: int, prefetch: int, queued: int) -> int:
    """The credit a client gives once ``step`` is in its queue of ``prefetch`` holding ``queued`` steps:
    room for the queue to fill, plus one step in transport."""
    return step + 1 + max(0, prefetch - queued) + 1


class CreditReader:
    """The constructor's side: the client's credit, read from the exchange as it is needed."""

    def __init__(self, reader: fl.FlightStreamReader, first: int):
        self._reader = reader
        self.upto = first + 1  # the first step is always sent (it carries the schema)

    def allows(self, step: int, stopping: Callable[[], bool]) -> bool:
        """Wait until ``step`` may be sent; False when the client ended the stream or the server stops."""
        while step >= self.upto:
            if stopping():
                return False
            try:
                chunk = self._reader.read_chunk()
            except StopIteration:  # the client is done (closed, or moved on)
                return False
            if chunk.data is not None or chunk.app_metadata is None:
                raise ValueError("malformed credit: send {\"upto\": STEP} as app_metadata only (no record batch)")
            self.upto = max(self.upto, _upto(decode(chunk.app_metadata.to_pybytes(), "credit")))
        return not stopping()


def _upto(body) -> int:
    upto = body.get("upto") if isinstance(body, dict) else None
    if isinstance(upto, bool) or not isinstance(upto, int):
        raise ValueError(f"malformed credit {body!r}: expected {{\"upto\": STEP}}")
    return upto
