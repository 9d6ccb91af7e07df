"""Bad and hostile input against live servers: clear errors that name the problem, no server
traceback to any client, no thread held by an absurd request, and the run unharmed."""
from __future__ import annotations

import concurrent.futures
import json
import signal
import time

import pyarrow.flight as fl
import pytest

from flight_overlord import wire
from flight_overlord.client import TrainerClient
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.wire.plan import ConstructorPlan
from flight_overlord.wire.plan_channel import PLANS, PlanChannel
from flight_overlord.wire.server import FORCED_EXIT_STATUS, SHUTDOWN_GRACE_SECONDS, connect

from ..helpers import assert_every_planned_sample_once, write_config


@pytest.fixture(scope="module")
def cluster(corpus, tmp_path_factory):
    path = write_config(tmp_path_factory.mktemp("hardening"), corpus)
    with LocalCluster(path) as running:
        yield running, path


def _error(call) -> str:
    with pytest.raises(fl.FlightError) as info:
        call()
    return str(info.value)


def test_no_error_carries_a_server_traceback(cluster):
    running, _ = cluster
    # plan, register and a loader's tickets are internal calls: the clients carry the run's secret
    planner = connect(running.planner, running.credentials)
    constructor = connect(running.child("constructor-0").location, running.credentials)
    loader = connect(running.loader_of("code", 0).location, running.credentials)
    calls = [
        lambda: planner.get_flight_info(fl.FlightDescriptor.for_path("batch", "x", "0")),
        lambda: planner.get_flight_info(fl.FlightDescriptor.for_path("nope")),
        lambda: list(planner.do_action(fl.Action("plan", b"[1, 2"))),
        lambda: list(planner.do_action(fl.Action("register", json.dumps({"role": "loader"}).encode()))),
        lambda: constructor.do_get(fl.Ticket(b"\xff\xfe")).read_all(),
        lambda: constructor.do_get(fl.Ticket(json.dumps({"kind": "batch", "step": 0, "rank": 77}).encode())).read_all(),
        lambda: loader.do_get(fl.Ticket(json.dumps({"kind": "samples", "source": "code", "actor": 0, "step": 0,
                                                    "constructor": 0,
                                                    "samples": [[0, "../../etc/passwd", 0, 0]]}).encode())).read_all(),
        lambda: loader.do_get(fl.Ticket(json.dumps({"kind": "metadata", "source": "code", "actor": 0, "epoch": -5,
                                                    "file": 3, "row_group": 0}).encode())).read_all(),
    ]
    for call in calls:
        message = _error(call)
        assert "Traceback" not in message and 'File "' not in message, message
        assert "invalid request" in message or "not found" in message, message


def test_absurd_steps_are_refused_at_once(cluster):
    running, _ = cluster
    planner = connect(running.planner, running.credentials)
    started = time.monotonic()
    message = _error(lambda: planner.get_flight_info(fl.FlightDescriptor.for_path("batch", str(10 ** 12), "0")))
    assert "beyond the planning horizon" in message
    assert time.monotonic() - started < 5, "an absurd step held a server thread"
    assert "step must be >= 0" in _error(
        lambda: planner.get_flight_info(fl.FlightDescriptor.for_path("batch", "-1", "0")))
    assert "beyond the planning horizon" in _error(
        lambda: list(planner.do_action(fl.Action("plan", json.dumps({"step": 10 ** 9, "constructor": 0}).encode()))))


def test_oversized_action_body_is_refused(cluster):
    running, _ = cluster
    planner = fl.connect(running.planner)
    message = _error(lambda: list(planner.do_action(fl.Action("report", b" " * (2 << 20)))))
    assert "over the" in message and "limit" in message


def test_the_plans_stream_answers_bad_messages_and_stays_open(cluster):
    """A constructor's plans stream (do_exchange): the cluster secret, its one descriptor, and every bad
    message answered with a clear error on the same stream, which keeps serving."""
    running, _ = cluster
    assert "needs the run's cluster secret" in _error(lambda: PlanChannel().ask(fl.connect(running.planner), {}))
    planner = connect(running.planner, running.credentials)
    assert "unknown do_exchange descriptor" in _error(
        lambda: planner.do_exchange(fl.FlightDescriptor.for_path("nope"))[1].read_chunk())
    writer, reader = planner.do_exchange(fl.FlightDescriptor.for_path(PLANS))
    writer.write_metadata(b"[1, 2")
    assert "malformed plans message" in json.loads(reader.read_chunk().app_metadata.to_pybytes())["error"]
    channel = PlanChannel()
    for body, expected in (({"constructor": 0}, "missing field 'positions'"),
                           ({"constructor": 0, "positions": {"999": 1}}, "does not serve"),
                           ({"constructor": 99, "positions": {}}, "constructor 99 out of range"),
                           ({"step": 10 ** 9, "constructor": 0}, "beyond the planning horizon")):
        assert expected in _error(lambda: channel.ask(planner, body)), body
    assert channel.ask(planner, {"constructor": 0, "positions": {}}) == {"ok": True}
    plans = channel.ask(planner, {"step": 0, "constructor": 0})  # the same stream still serves, a record batch
    first = plans[0]  # (and the next step's plan, when it is planned: taken here, so asked for no more)
    assert first.step == 0 and first.keys and [p.step for p in plans] == list(range(len(plans))) and len(plans) <= 2
    assert first == ConstructorPlan.from_wire(json.loads(list(planner.do_action(fl.Action("plan", json.dumps(
        {"step": 0, "constructor": 0}).encode())))[0].body.to_pybytes()))  # as the plan action answers, in JSON
    channel.close()
    writer.close()


def test_the_run_is_unharmed_after_the_abuse(cluster):
    """After every bad request above, the run still delivers each planned sample exactly once."""
    running, path = cluster
    assert_every_planned_sample_once(running.planner, path)


def test_waiting_constructors_do_not_hold_the_planner_s_shutdown(cluster):
    """Constructors idle with their plans streams open (no trainer reads): the Planner still stops at
    once on SIGINT (a Flight server's shutdown waits for its handlers: the constructors' position
    reports let the plans streams' handlers see it stopping)."""
    running, _ = cluster
    first = wire.call(connect(running.planner, running.credentials), "status")["planned"] + 1  # none served yet
    clients = [TrainerClient(running.planner, rank, start_step=first, as_tensors=False)
               for rank in range(running.cfg.mesh.world_size)]
    with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:  # every rank stream reads a step, then stops
        list(pool.map(next, clients))
    for client in clients:
        client.close()
    time.sleep(2)  # the constructors assembled their prefetch and wait for the trainers
    process, restarts = running.child("planner").process, len(running.child("planner").restarts)
    running.kill("planner", signal.SIGINT)
    assert process.wait(timeout=20) == 0  # without the fix it waits for ever; 20 s spares a slow machine
    running.wait_restarted("planner", restarts + 1)  # the supervisor brings it back (--recover)


def test_a_stuck_plans_stream_holds_the_planner_s_sigint_stop_only_for_the_grace_period(cluster):
    """A peer that stops answering mid-stream (a constructor blocked in a loader fetch sends nothing on
    its plans stream; here, a stream that sends one message and then nothing) holds the Planner's
    handler: after SIGINT the process waits ``SHUTDOWN_GRACE_SECONDS`` for it, then exits anyway."""
    running, _ = cluster
    planner = running.child("planner")
    restarts = len(planner.restarts)
    client = connect(running.planner, running.credentials)
    writer, reader = client.do_exchange(fl.FlightDescriptor.for_path(PLANS))
    writer.write_metadata(json.dumps({"constructor": 0, "positions": {}}).encode())
    assert json.loads(reader.read_chunk().app_metadata.to_pybytes()) == {"ok": True}  # the handler is running
    # ... and, a moment later, blocked reading the next message: a SIGINT while it is still between its
    # answer and that read lets it see the Planner stopping and end (a clean exit, seen at load ~30)
    time.sleep(1)
    process = planner.process
    asked = time.monotonic()
    running.kill("planner", signal.SIGINT)
    try:
        assert process.wait(timeout=SHUTDOWN_GRACE_SECONDS + 20) == FORCED_EXIT_STATUS  # without the bound: never
    finally:
        client.close()
    assert time.monotonic() - asked >= SHUTDOWN_GRACE_SECONDS * 0.9  # the grace period was given
    assert "exiting without them" in planner.log_path.read_text()
    running.wait_restarted("planner", restarts + 1)  # the supervisor brings it back (--recover)
