"""The ``overlord`` command as users run it: a real process tree, signals, ports."""
from __future__ import annotations

import signal
import subprocess
import sys

import psutil
import pyarrow.flight as fl
import pytest

from flight_overlord.config import load_config
from flight_overlord.deploy.topology import loader_hosts

from ..helpers import write_config


def _start_up(config) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "flight_overlord.deploy.cli", "up", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    address = proc.stdout.readline().strip()  # printed once every role is ready
    assert address.startswith("grpc://127.0.0.1:"), address
    return proc, address


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_up_serves_then_shuts_everything_down_on_signal(corpus, tmp_path, sig):
    config = write_config(tmp_path, corpus)
    proc, address = _start_up(config)
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
        # planner, the loader processes (loader.hosts: auto), a constructor per dp rank
        assert len(children) == 1 + len(loader_hosts(load_config(config))) + 2
        client = fl.connect(address)
        assert client.get_flight_info(fl.FlightDescriptor.for_path("batch", "0", "0")).endpoints
        client.close()
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"orphans: {alive}"
        with pytest.raises(fl.FlightUnavailableError):  # the port is released
            fl.connect(address).list_actions(options=fl.FlightCallOptions(timeout=2))
    finally:
        if proc.poll() is None:
            proc.kill()


def test_inspect_uses_the_stock_api_and_shows_a_stream_head(idle_cluster):
    out = subprocess.run([sys.executable, "-m", "flight_overlord.deploy.cli", "inspect", idle_cluster.planner],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "batch/0/0" in out.stdout and "source/captions" in out.stdout
    assert "head of the stream (2 rows" in out.stdout and "sample_keys=" in out.stdout


def test_up_with_an_invalid_config_names_the_problem(corpus, tmp_path):
    config = write_config(tmp_path, corpus, balance={"method": "magic"})
    out = subprocess.run([sys.executable, "-m", "flight_overlord.deploy.cli", "up", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "balance.method: 'magic' is not one of" in out.stderr
