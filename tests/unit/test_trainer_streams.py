"""A TrainerClient reading a rank's batch and encoder streams in step: when one of them ends before the
other, iteration stops with an error naming the rank and the step, never silently.

The peer here is a Flight server that answers the rank-stream descriptors the way the Planner and a
constructor do (an endpoint at itself, then one table per step with its ``step``) but ENDs one
stream early and keeps ending it: a constructor gone wrong, which the real one cannot be made to be.
"""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from flight_overlord.client.trainer import TrainerClient, in_step

SCHEMA = pa.schema([("step", pa.int64())])


class _EndsEarly(fl.FlightServerBase):
    """Rank streams whose kind ("rank", "encoder-rank") ENDs before step ``ends[kind]``, every time asked."""

    def __init__(self, ends: dict[str, int]):
        super().__init__("grpc://127.0.0.1:0")
        self.ends = ends

    def get_flight_info(self, context, descriptor):
        kind, _rank, first = (part.decode() for part in descriptor.path[:3])
        ticket = fl.Ticket(json.dumps({"kind": kind, "first": int(first)}).encode())
        endpoint = fl.FlightEndpoint(ticket, [f"grpc://127.0.0.1:{self.port}"])
        return fl.FlightInfo(SCHEMA, descriptor, [endpoint], -1, -1)

    def _batches(self, raw: bytes):
        asked = json.loads(raw)
        return (pa.record_batch([pa.array([s], pa.int64())], schema=SCHEMA)
                for s in range(asked["first"], self.ends[asked["kind"]]))

    def do_get(self, context, ticket):
        return fl.GeneratorStream(SCHEMA, self._batches(ticket.ticket))

    def do_exchange(self, context, descriptor, reader, writer):
        """The rank stream as TrainerClient reads it (credits not heeded: the steps are tiny)."""
        writer.begin(SCHEMA)
        for batch in self._batches(descriptor.command):
            writer.write_batch(batch)


def _read(ends: dict[str, int], steps: int) -> tuple[list[int], BaseException]:
    server = _EndsEarly(ends)
    got = []
    try:
        with TrainerClient(f"grpc://127.0.0.1:{server.port}", 3, num_steps=steps, encoder=True, as_tensors=False,
                           timeout=1.0) as client:
            with pytest.raises((RuntimeError, TimeoutError)) as raised:
                for table, encoder in client:
                    assert table.column("step").to_pylist() == encoder.column("step").to_pylist()
                    got.append(table.column("step")[0].as_py())
    finally:
        server.shutdown()
    return got, raised.value


@pytest.mark.parametrize("short", ["encoder-rank", "rank"])
def test_an_end_on_one_stream_only_is_an_error_naming_the_rank_and_step(short):
    """One stream ENDs after step 2 (and at every reconnect) while the other goes on to step 5: the
    steps both sent are yielded, then an error naming rank 3, the stream and step 3."""
    got, error = _read({"rank": 6, "encoder-rank": 6, short: 3}, steps=6)
    assert got == [0, 1, 2]
    assert f"rank 3: the {short} stream" in str(error) and "at step 3" in str(error)


def test_two_streams_in_step_that_end_apart_are_an_error_not_a_silent_end():
    """``in_step`` on the two rank streams: either one ending first names the rank and the step."""
    def stream(end):
        return ((s, pa.table({"step": [s]})) for s in range(end))
    assert [s for s, _, _ in in_step(1, stream(3), stream(3))] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="rank 1: the encoder stream ended before step 2"):
        list(in_step(1, stream(4), stream(2)))
    with pytest.raises(RuntimeError, match="rank 1: the batch stream ended before step 2"):
        list(in_step(1, stream(2), stream(4)))
    with pytest.raises(RuntimeError, match="rank 1: encoder stream at step 1, batches at 0"):
        list(in_step(1, stream(2), ((s + 1, t) for s, t in stream(3))))
