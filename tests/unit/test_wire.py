"""The client pool: forgetting a location's client (after it did not answer) never breaks a call
another thread is making on it; the next get connects afresh."""
from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.flight as fl
import pytest

from flight_overlord.wire.server import ROLE_DOWN_ENV, ClientPool, RoleDown, call_any


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


def test_call_any_asks_for_the_locations_again_each_round_and_finds_a_peer_that_moved():
    """A peer restarted on a new address (and re-registered): a caller whose locations come from a
    function finds it at the next round, not only when its list was made."""
    gone = _Echo("grpc://127.0.0.1:0")
    old = f"grpc://127.0.0.1:{gone.port}"
    gone.shutdown()  # the peer's old process, killed
    moved = _Echo("grpc://127.0.0.1:0")
    registered = [[old]]  # what the roster says; the peer re-registers below
    asked = []

    def locations():
        asked.append(list(registered[0]))
        registered[0] = [f"grpc://127.0.0.1:{moved.port}"]  # it came back meanwhile
        return asked[-1]
    pool = ClientPool()
    try:
        actions = call_any(pool, locations, lambda c: [a.type for a in c.list_actions()], what="peer", timeout=10)
        assert actions == ["echo"] and asked == [[old], registered[0]]
        with pytest.raises(RoleDown, match=f"peer: unreachable at {old}"):  # a fixed list keeps to it
            call_any(pool, [old], lambda c: c.list_actions(), what="peer", timeout=0.2)
    finally:
        pool.close()
        moved.shutdown()


def test_a_bad_role_down_bound_is_named():
    result = subprocess.run([sys.executable, "-c", "import flight_overlord.wire.server"], capture_output=True,
                            text=True, env={**os.environ, ROLE_DOWN_ENV: "soon"}, timeout=60)
    assert result.returncode != 0 and f"{ROLE_DOWN_ENV}='soon': must be a positive number of seconds" in result.stderr
