"""A role that hangs is a failure too: SIGSTOP a role's process mid-run and it is found hung
(``liveness``), killed and replaced (the standby takes the Planner's address over, constructors fail
over to a loader's shadow, the supervisor restarts the rest), and every rank's stream equals the
undisturbed run's. A process that wakes up after it was replaced serves nothing (fencing). Without a
supervisor (``overlord serve``), ``overlord probe`` tells an orchestrator a hung role from a live one. The loader
actors share two processes (``loader.hosts: 2``, which changes no stream): a stop hits several sources,
and the clusters start fewer processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from flight_overlord.config import load_config
from flight_overlord.deploy.cli import main as overlord
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.fence import FENCED_EXIT_STATUS, Fence
from flight_overlord.planner.audit import offline_audit
from flight_overlord.wire.security import SECRET_ENV

from ..helpers import train, write_config
from .test_recovery import STEPS, config

STOP_SECONDS = 8.0  # every SIGSTOP is undone after this (a hang that was not handled ends, and the test fails)


@pytest.fixture(scope="module")
def reference(recovery_reference):
    return recovery_reference  # test_recovery's config, undisturbed


def run(path, faults: dict, check=None) -> dict[int, list]:
    """Trainers through steps [0, STEPS); ``faults[step](cluster)`` when rank 0 reaches ``step``; every
    role a fault touched is awaited back before ``check(cluster)`` and the stop."""
    with LocalCluster(path) as cluster:
        fired = []

        def on_step(rank: int, step: int) -> None:
            if rank == 0 and step in faults and step not in fired:
                fired.append(step)
                faults[step](cluster)
        streams = train(cluster.planner, 0, STEPS, on_step=on_step)
        if check is not None:
            check(cluster)
    assert sorted(fired) == sorted(faults), "the run never reached the steps of some faults"
    return streams


class Hangs:
    """SIGSTOP of named roles (each undone after ``STOP_SECONDS``), remembering the stopped processes."""

    def __init__(self):
        self.stopped: list[tuple[str, object]] = []  # (role, its Popen when stopped)

    def at(self, role: str):
        def fault(cluster) -> None:
            process = cluster.child(role).process
            os.kill(process.pid, signal.SIGSTOP)
            timer = threading.Timer(STOP_SECONDS, _resume, (process,))
            timer.daemon = True
            timer.start()
            self.stopped.append((role, process))
        return fault

    def check(self, cluster) -> None:
        """Each stopped process was found hung and killed (by the supervisor's liveness probe, or the
        standby whose lease on the Planner ran out; a stop undone after STOP_SECONDS would have let it
        live on), and its role serves again."""
        for role, process in self.stopped:
            cluster.wait_restarted(role, timeout=60)
            assert process.wait(timeout=30) == -signal.SIGKILL, f"{role} was not killed as hung"


def _resume(process) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGCONT)


def test_hung_planner_loader_and_constructor_with_standby_and_shadow_change_no_rank_stream(reference, corpus,
                                                                                            tmp_path):
    """planner.standbys: 1 and loader.shadows: 1: the standby takes over a Planner whose lease ran out,
    constructors fetch from the hung loader's shadow, trainers move to the replaced constructor."""
    hangs = Hangs()
    path = config(tmp_path, corpus, planner={"standbys": 1}, loader={"shadows": 1, "hosts": 2})
    faults = {9: hangs.at("planner"), 26: hangs.at("loader-host0"), 43: hangs.at("constructor-0")}
    assert run(path, faults, check=hangs.check) == reference


def test_hung_loader_without_a_shadow_is_replaced_and_a_woken_replaced_process_serves_nothing(
        reference, corpus, tmp_path):
    """Without a shadow the hung loader's replacement reads the same row groups. A constructor that
    wakes up after its role was claimed by another process (its replacement) exits at once, serving no
    step: the fence."""
    hangs, fenced = Hangs(), []
    path = config(tmp_path, corpus, loader={"hosts": 2})
    run_dir = load_config(path).run_dir

    def replaced_while_stopped(cluster) -> None:
        process = cluster.child("constructor-1").process
        os.kill(process.pid, signal.SIGSTOP)
        Fence(run_dir, "constructor-1").claim()  # what a replacement does first
        os.kill(process.pid, signal.SIGCONT)
        fenced.append(process)

    def check(cluster) -> None:
        hangs.check(cluster)
        assert fenced[0].wait(timeout=30) == FENCED_EXIT_STATUS
        cluster.wait_restarted("constructor-1", timeout=60)

    assert run(path, {12: hangs.at("loader-host1"), 35: replaced_while_stopped}, check=check) == reference
    report = offline_audit(run_dir)  # the constructors' journals of what they served agree with the trainers
    delivered = sum(len(mb) for stream in reference.values() for _, (mbs, _) in stream for mb in mbs)
    assert (report["samples"], report["duplicates"], report["missing"]) == (delivered, 0, 0)


def _probe(address: str, capsys) -> tuple[int, str]:
    """``overlord probe ADDRESS --timeout 1``: its exit status and what it said."""
    try:
        overlord(["probe", address, "--timeout", "1"])
        status = 0
    except SystemExit as exc:
        status = 0 if exc.code is None else 1
        print(exc.code)
    return status, capsys.readouterr().out.strip()


def test_overlord_probe_tells_a_live_role_from_a_hung_and_a_dead_one(corpus, tmp_path, capsys):
    """A Planner under ``overlord serve`` (no supervisor): answered, SIGSTOP (hung), SIGCONT, kill -9 (down)."""
    ready = tmp_path / "ready"
    process = subprocess.Popen([sys.executable, "-m", "flight_overlord.deploy.cli", "serve", "planner", "--config",
                                str(write_config(tmp_path, corpus)), "--ready-file", str(ready)],
                               env={**os.environ, SECRET_ENV: "probe-test-secret-0123456789"})
    try:
        deadline = time.monotonic() + 60
        while not (ready.exists() and ready.read_text().strip()):
            assert process.poll() is None and time.monotonic() < deadline, "the Planner did not start"
            time.sleep(0.1)
        address = ready.read_text().strip()
        assert _probe(address, capsys) == (0, f"up: {address}")
        os.kill(process.pid, signal.SIGSTOP)
        try:
            assert _probe(address, capsys) == (1, f"hung: {address}: no answer within 1 s")
        finally:
            os.kill(process.pid, signal.SIGCONT)
        assert _probe(address, capsys)[0] == 0
    finally:
        process.kill()
        process.wait(timeout=30)
    assert _probe(address, capsys) == (1, f"down: {address}: nothing answers there (not listening)")
    status, said = _probe("127.0.0.1:1", capsys)
    assert status == 1 and "is not of the form grpc://HOST:PORT" in said
