"""Credits of a rank stream (wire/credits.py): a client's credit leaves prefetch + 1 steps in flight, and
the constructor sends a step only within the credit it read."""
from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest

from flight_overlord.wire.credits import CreditReader, credit_after, credit_message


class _Chunks:
    """A do_exchange reader's side as the constructor sees it: the client's messages, in order."""

    def __init__(self, messages):
        self._messages = list(messages)

    def read_chunk(self):
        if not self._messages:
            raise StopIteration
        return SimpleNamespace(data=None, app_metadata=pa.py_buffer(self._messages.pop(0)))


def test_credit_after_leaves_prefetch_plus_one_steps_in_flight():
    prefetch = 2
    for queued in range(prefetch + 1):  # after step 9 is queued with `queued` steps in the queue
        upto = credit_after(9, prefetch, queued)
        assert queued + (upto - 10) == prefetch + 1  # in the queue, plus what may still be sent
    assert credit_after(-1, prefetch, 0) == prefetch + 1  # the start: steps 0..prefetch


def test_the_constructor_sends_a_step_only_within_the_credit():
    reader = CreditReader(_Chunks([credit_message(3), credit_message(2), credit_message(6)]), first=0)
    assert reader.allows(0, lambda: False)  # the first step always goes (it carries the schema)
    assert reader.allows(2, lambda: False) and reader.upto == 3
    assert reader.allows(5, lambda: False) and reader.upto == 6  # a smaller credit never takes one back
    assert not reader.allows(6, lambda: False)  # the client ended the stream
    assert not CreditReader(_Chunks([credit_message(9)]), first=0).allows(3, lambda: True)  # the server stops
    with pytest.raises(ValueError, match="malformed credit"):
        CreditReader(_Chunks([b'{"upto": "x"}']), first=0).allows(1, lambda: False)
