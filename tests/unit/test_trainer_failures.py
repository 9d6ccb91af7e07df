"""The pieces of the trainer's side of failures, without servers (credits: test_credits.py; steps
built again: test_rebuilt.py): the client's address check, wait log and one-line refusals, the
Planner's address kept for a resume, a re-fetch of a released row group, and rewinds in the audit."""
from __future__ import annotations

import logging
import socket
import time
from types import SimpleNamespace

import pyarrow.flight as fl
import pytest

from flight_overlord.client.fetcher import WaitLog, checked_address
from flight_overlord.deploy import planner_address
from flight_overlord.errors import ConfigError
from flight_overlord.loader.state import LoaderState
from flight_overlord.planner.audit import compute_audit, render
from flight_overlord.wire.server import refusal


@pytest.mark.parametrize("address", ["127.0.0.1:8815", "http://h:1", "grpc://h", "grpc://h:port", "", None])
def test_a_planner_address_of_another_form_is_a_value_error_naming_it(address):
    with pytest.raises(ValueError, match="is not of the form grpc://HOST:PORT"):
        checked_address(address)


def test_a_planner_address_of_the_printed_form_passes():
    for address in ("grpc://127.0.0.1:8815", "grpc+tls://node-3.cluster:443"):
        assert checked_address(address) == address


def test_a_wait_is_logged_with_what_where_and_since_at_most_every_few_seconds(caplog):
    waits = WaitLog(rank=3, every=5.0)
    since = time.time() - 7
    with caplog.at_level(logging.WARNING, logger="flight_overlord.client"):
        waits.waiting("rank ticket from step 8", "the planner at grpc://h:1", since, "unreachable")
        waits.waiting("rank ticket from step 8", "the planner at grpc://h:1", since, "unreachable")
        WaitLog(rank=3).waiting("ticket", "the planner at grpc://h:1", time.time(), "just asked")  # not yet a wait
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert message.startswith("rank 3: waiting for rank ticket from step 8 from the planner at grpc://h:1 since ")
    assert message.endswith("(7 s): unreachable")


def test_a_refusal_is_one_line_without_the_transports_detail():
    raw = fl.FlightServerError("invalid request: bad step. Detail: Failed. gRPC client debug context: UNKNOWN:...")
    assert refusal(raw) == "invalid request: bad step"


def _run(tmp_path, port: int = 0):
    return SimpleNamespace(run_dir=tmp_path, network=SimpleNamespace(host="127.0.0.1", planner_port=port))


def test_a_resume_comes_back_on_the_runs_previous_planner_port(tmp_path):
    assert planner_address.resume_port_args(_run(tmp_path)) == []  # no previous start
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    planner_address.record(_run(tmp_path), f"grpc://127.0.0.1:{port}")
    assert planner_address.resume_port_args(_run(tmp_path)) == ["--port", str(port)]
    assert planner_address.resume_port_args(_run(tmp_path, port)) == ["--port", str(port)]


def test_a_resume_that_cannot_come_back_where_trainers_look_names_both_addresses(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        planner_address.record(_run(tmp_path), f"grpc://127.0.0.1:{port}")
        with pytest.raises(ConfigError, match=f"was at grpc://127.0.0.1:{port} .* port {port} of 127.0.0.1 is in use"):
            planner_address.resume_port_args(_run(tmp_path))
    with pytest.raises(ConfigError, match=f"was at grpc://127.0.0.1:{port} .*asks for port 1 \\(grpc://127.0.0.1:1\\)"):
        planner_address.resume_port_args(_run(tmp_path, 1))


def test_a_released_row_group_fetched_again_changes_no_loader_state():
    state = LoaderState()
    state.apply({"fetch": 0, "constructor": 0, "rows": [[0, 0, 1], [0, 1, 1]]})
    state.release(0)
    before = state.state_dict()
    assert state.apply({"fetch": 0, "constructor": 1, "rows": [[0, 0, 2], [0, 1, 1]]}) == []
    assert state.state_dict() == before


def test_the_audit_shows_a_rewind_as_one_not_as_duplicates():
    rewinds = [{"t": 1.0, "rewind": 0, "step": 10, "served": 21}]
    report = compute_audit([0.0], [], [], [], rewinds)
    assert report["rewinds"] == [{"rank": 0, "to_step": 10, "served_through": 21, "steps_again": 12}]
    assert report["duplicates"] == 0
    rewind = "rewind: rank 0 went back to step 10 after step 21 (12 step(s) served again, not duplicates)"
    assert rewind in render(report)
