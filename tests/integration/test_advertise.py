"""Bind address vs advertised address (multi-node ``overlord serve``), on loopback: roles bind to
127.0.0.1 (or every interface) and register, and put in tickets, the name they are reached at."""
from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pyarrow.flight as fl

from flight_overlord import wire
from flight_overlord.client import TrainerClient
from flight_overlord.config import load_config
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.wire.security import SECRET_ENV
from flight_overlord.wire.server import connect

from ..helpers import assert_every_planned_sample_once, write_config


def test_roles_register_and_ticket_the_advertised_name(corpus, tmp_path):
    path = write_config(tmp_path, corpus, network={"host": "127.0.0.1", "advertise": "localhost"},
                        sources=[{"name": "qa", "paths": "qa/*.parquet", "weight": 1.0, "loaders": 2}])
    with LocalCluster(path) as cluster:
        assert cluster.planner.startswith("grpc://localhost:")
        client = connect(cluster.planner, cluster.credentials)
        status = wire.call(client, "status")
        client.close()
        locations = [loc for *_, loc, _ in status["loaders"]] + list(status["constructors"].values())
        assert len(locations) == 2 + 2 and all(loc.startswith("grpc://localhost:") for loc in locations), locations
        stock = fl.connect(cluster.planner)  # a stock client follows the advertised name
        info = stock.get_flight_info(fl.FlightDescriptor.for_path("batch", "0", "0"))
        assert info.endpoints[0].locations[0].uri.decode().startswith("grpc://localhost:")
        stock.close()
        assert_every_planned_sample_once(cluster.planner, path, steps=3)


def _serve_planner(config, *flags, timeout=60, role="planner"):
    ready = config.parent / f"ready-{len(flags)}"
    process = subprocess.Popen([sys.executable, "-m", "flight_overlord.deploy.cli", "serve", role, "--config",
                                str(config), "--ready-file", str(ready), *flags],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, SECRET_ENV: "advertise-test-secret-0123456789"})
    deadline = time.monotonic() + timeout
    while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return process, ready


def test_a_wildcard_bind_needs_an_advertised_address(corpus, tmp_path):
    config = write_config(tmp_path, corpus, network={"host": "0.0.0.0"})
    process, _ = _serve_planner(config)
    output = process.communicate(timeout=30)[0]
    assert process.returncode != 0 and "network.host '0.0.0.0' binds every interface" in output
    assert "--advertise HOST" in output and "Traceback" not in output

    process, _ = _serve_planner(config, "--advertise", "grpc://127.0.0.1:9000")
    output = process.communicate(timeout=30)[0]
    assert process.returncode != 0 and "--advertise: 'grpc://127.0.0.1:9000' is not a host name" in output

    process, ready = _serve_planner(config, "--advertise", "127.0.0.1", "--metrics-port", "0")  # every interface
    try:
        assert ready.exists(), process.communicate(timeout=5)[0] if process.poll() is not None else "not ready"
        location = ready.read_text()
        assert location.startswith("grpc://127.0.0.1:")
        client = fl.connect(location)
        assert {a.type for a in client.list_actions()} >= {"status", "register"}
        metrics = json.loads(client.do_action(fl.Action("status", b"{}")).__next__().body.to_pybytes())["metrics"]
        client.close()
        assert metrics.startswith("http://127.0.0.1:")  # the page is named at the advertised host
        page = urllib.request.urlopen(metrics, timeout=10).read().decode()
        assert f'overlord_role_up{{address="{location}",role="planner"}} 1.0' in page
    finally:
        process.terminate()
        process.communicate(timeout=30)


def test_serve_node_hands_its_advertised_name_to_every_role_it_hosts(corpus, tmp_path):
    """``overlord serve node --advertise HOST`` (the flags every ``overlord serve ROLE`` has): the
    Planner, loaders and constructor it hosts all register, and are ticketed, at HOST."""
    config = write_config(tmp_path, corpus, deployment="single_node")
    process, ready = _serve_planner(config, "--advertise", "localhost", role="node")
    try:
        assert ready.exists(), process.communicate(timeout=5)[0] if process.poll() is not None else "not ready"
        location = ready.read_text()
        assert location.startswith("grpc://localhost:")
        client = fl.connect(location)
        status = json.loads(client.do_action(fl.Action("status", b"{}")).__next__().body.to_pybytes())
        client.close()
        locations = [loc for *_, loc, _ in status["loaders"]] + list(status["constructors"].values())
        assert len(locations) >= 2 and all(loc.startswith("grpc://localhost:") for loc in locations), locations
    finally:
        process.terminate()
        process.communicate(timeout=30)


def test_serve_node_stops_on_sigint_with_its_plans_streams_open(corpus, tmp_path):
    """SIGINT to ``overlord serve node`` once its trainers read a step and stopped: the constructors it
    hosts end their plans streams as they stop, so the Planner stops too (a Flight server's shutdown
    waits for every handler, and a plans stream's handler waits for the constructor's next message)."""
    config = write_config(tmp_path, corpus, deployment="single_node")
    process, ready = _serve_planner(config, role="node")
    try:
        assert ready.exists(), process.communicate(timeout=5)[0] if process.poll() is not None else "not ready"
        location = ready.read_text()
        ranks = load_config(config).mesh.world_size
        clients = [TrainerClient(location, rank, as_tensors=False) for rank in range(ranks)]
        with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:
            list(pool.map(next, clients))
        for client in clients:
            client.close()
        time.sleep(1)  # the constructors assembled their prefetch and wait for the trainers
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=20)[0]
        assert "Traceback" not in output, output[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
