"""The client pool: forgetting a location's client (after it did not answer) never breaks a call
another thread is making on it; the next get connects afresh."""
from __future__ import annotations

import pyarrow.flight as fl

from flight_overlord.wire.server import ClientPool


class _Echo(fl.FlightServerBase):
    def list_actions(self, context):
        return [("echo", "answers")]


def test_a_forgotten_client_still_serves_the_threads_that_hold_it():
    server = _Echo("grpc://127.0.0.1:0")
    location = f"grpc://127.0.0.1:{server.port}"
    pool = ClientPool()
    try:
        held = pool.get(location)  # a fetch thread mid-call holds this one
        pool.forget(location)      # another thread saw the location down and forgot it
        assert [a.type for a in held.list_actions()] == ["echo"]  # not closed under the holder
        fresh = pool.get(location)
        assert fresh is not held and [a.type for a in fresh.list_actions()] == ["echo"]
    finally:
        pool.close()
        server.shutdown()
