"""The trainer side of failures, against a running data plane (real roles on loopback ports):

- a rank restarted from a checkpoint 10 steps old gets exactly the undisturbed stream from there, the
  released steps built again from the journal, while the other rank keeps going; the audit shows a
  rewind, not duplicates;
- steps in flight to a rank (sent by its constructor, not yet yielded to the training loop) stay
  within ``prefetch + 1`` with a training loop slower than the data plane;
- a rank killed (-9) and restarted with no checkpoint takes its position from the Planner
  (``TrainerClient.rejoin``, a torchft replica group rejoining) and gets the undisturbed stream from there;
- a rank asked to go back before what the journal can serve again gets a one-line refusal naming
  the step to load instead;
- Ctrl-C (SIGINT) of ``overlord up`` and ``overlord up --resume`` under running trainers, with
  ``planner_port: 0``: the Planner comes back where the trainers look, no trainer errs, and every
  rank's stream is the undisturbed one.
"""
from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import subprocess
import sys
import threading
import time

import pyarrow.flight as fl
import pytest

from flight_overlord import harness, wire
from flight_overlord.client import TrainerClient
from flight_overlord.config import load_config
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.harness import step_digest
from flight_overlord.planner.audit import offline_audit
from flight_overlord.wire.server import connect

from ..helpers import write_config

STEPS, PREFETCH = 30, 2
CRASH_AT, CHECKPOINT = 20, 10  # rank 0 stops after step 19, restarts from its checkpoint of step 10
SLOW_STEP = 0.03  # the reference run's training loop is slower than the data plane: prefetch fills up




@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """An undisturbed run's streams, every rank through a TrainerClient whose loop is slower than the
    data plane; with them, the most steps ever in flight to a rank (sent, not yet yielded)."""
    in_flight = {0: [], 1: []}
    lock = threading.Lock()

    def on_table(rank, client, table):
        step = table.column("step")[0].as_py()
        with lock:  # yielded through ``step``: what the constructor sent beyond it is in flight
            in_flight[rank].append(harness.served_step(cluster, rank) - step)
        time.sleep(SLOW_STEP)
        return step, step_digest(table)

    with LocalCluster(write_config(tmp_path_factory.mktemp("reference"), corpus, prefetch=PREFETCH)) as cluster:
        streams = harness.train(cluster.planner, 2, 0, STEPS, on_table=on_table, prefetch=PREFETCH)
    return streams, in_flight


def test_steps_in_flight_to_a_rank_stay_within_prefetch_plus_one(reference):
    _, in_flight = reference
    for rank, counts in in_flight.items():
        assert len(counts) == STEPS
        assert max(counts) <= PREFETCH + 1, (rank, counts)
        assert max(counts) >= 1, (rank, counts)  # the client did prefetch (the measure sees steps in flight)


def _train(planner: str, rank: int, first: int, last: int, *, prefetch: int = PREFETCH) -> list:
    with TrainerClient(planner, rank, num_steps=last - first, prefetch=prefetch, as_tensors=False,
                       timeout=120) as client:
        client.load_state_dict({"rank": rank, "next_step": first})
        return [(t.column("step")[0].as_py(), step_digest(t)) for t in client]


def test_a_rank_restarted_from_a_checkpoint_10_steps_old_gets_the_undisturbed_stream(reference, corpus, tmp_path):
    expected, _ = reference
    config = write_config(tmp_path, corpus, prefetch=PREFETCH)
    got: dict[int, list] = {}

    def rank_loop(rank: int) -> None:
        if rank == 1:  # goes on undisturbed, held back only by rank 0's position (planning paces to the slowest)
            got[1] = _train(cluster.planner, 1, 0, STEPS)
            return
        before = _train(cluster.planner, 0, 0, CRASH_AT)  # steps in flight to it are lost with its client
        got[0] = before + _train(cluster.planner, 0, CHECKPOINT, STEPS)  # the checkpoint's position

    with LocalCluster(config) as cluster:
        harness.each_rank(rank_loop, 2, timeout=300)
        with pytest.raises(fl.FlightServerError) as refused:  # before what the journal serves again
            _refuse_before_the_oldest_snapshot(cluster)
    assert "\n" not in str(refused.value) and "Detail" not in str(refused.value)
    assert "cannot go back to step 0" in str(refused.value) and "load a checkpoint of step" in str(refused.value)

    assert got[1] == expected[1]
    assert got[0][:CRASH_AT] == expected[0][:CRASH_AT]
    assert got[0][CRASH_AT:] == expected[0][CHECKPOINT:]  # steps 10..29 again: exactly as undisturbed
    report = offline_audit(load_config(config).run_dir, str(config))
    assert report["duplicates"] == 0 and report["missing"] == 0 and not report["unverified"]
    assert any(r["rank"] == 0 and r["to_step"] == CHECKPOINT and r["served_through"] >= CRASH_AT - 1
               for r in report["rewinds"]), report["rewinds"]


KILL_AT = 12  # the rank without a checkpoint is killed once it yielded this step
# a trainer process of one rank: prints each step it yields, its training loop slower than the data plane;
# from the step it is to be killed at it yields nothing more (the kill then finds it there)
_TRAINER = """
import sys, time
from flight_overlord.client import TrainerClient
with TrainerClient(sys.argv[1], int(sys.argv[2]), prefetch=int(sys.argv[3]), as_tensors=False, timeout=120) as client:
    for table in client:
        step = table.column("step")[0].as_py()
        print(step, flush=True)
        time.sleep(600 if step >= int(sys.argv[5]) else float(sys.argv[4]))
"""


def _killed_after(planner: str, rank: int, step: int) -> int:
    """Rank ``rank`` in a process of its own, killed (-9) once it yielded ``step``: the last step it yielded."""
    proc = subprocess.Popen([sys.executable, "-c", _TRAINER, planner, str(rank), str(PREFETCH), str(SLOW_STEP),
                             str(step)], stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if int(line) >= step:
                return int(line)
        raise AssertionError(f"the trainer of rank {rank} ended before step {step} (exit {proc.wait()})")
    finally:
        proc.kill()
        proc.wait()


def test_a_rank_restarted_without_state_rejoins_where_the_planner_says(reference, corpus, tmp_path):
    expected, _ = reference
    config = write_config(tmp_path, corpus, prefetch=PREFETCH)
    got: dict[int, list] = {}
    rejoined: dict[str, int] = {}

    def rank_loop(rank: int) -> None:
        if rank == 1:  # goes on undisturbed, held back only by rank 0's position
            got[1] = _train(cluster.planner, 1, 0, STEPS)
            return
        rejoined["killed_after"] = _killed_after(cluster.planner, 0, KILL_AT)
        with TrainerClient(cluster.planner, 0, prefetch=PREFETCH, as_tensors=False, timeout=120) as client:
            rejoined["step"] = first = client.rejoin()  # no checkpoint: the Planner says where
            client.num_steps = STEPS - first
            got[0] = [(t.column("step")[0].as_py(), step_digest(t)) for t in client]

    with LocalCluster(config) as cluster:
        harness.each_rank(rank_loop, 2, timeout=300)
    first = rejoined["step"]
    # every step the killed process yielded is behind the rejoin step; at most what was in flight to it beyond
    assert rejoined["killed_after"] < first <= rejoined["killed_after"] + PREFETCH + 2, rejoined
    assert got[0] == expected[0][first:]
    assert got[1] == expected[1]
    report = offline_audit(load_config(config).run_dir, str(config))
    # what went to the killed process counts as delivered: nothing missing, nothing twice
    assert report["duplicates"] == 0 and report["missing"] == 0 and not report["unverified"], report
    # the dead stream's handler notices its client gone only as it writes: a step it had credit for, handed
    # out after the position was asked, is served again from the rejoin step (a rewind), never earlier ones
    last_credited = rejoined["killed_after"] + PREFETCH + 1
    assert all(r["rank"] == 0 and r["to_step"] == first and r["served_through"] <= last_credited
               for r in report["rewinds"]), report["rewinds"]


def _refuse_before_the_oldest_snapshot(cluster) -> None:
    """Move the Planner's step-0 snapshot aside (as an operator pruning them would), then ask rank 0's
    stream from step 0 through a TrainerClient: the refusal is raised, as one line."""
    planner_dir = cluster.cfg.run_dir / "planner"
    first = sorted(planner_dir.glob("planner-*.json"))[0]
    shutil.move(first, first.with_suffix(".aside"))
    try:
        with TrainerClient(cluster.planner, 0, num_steps=1, as_tensors=False, timeout=30) as client:
            next(client)
    finally:
        shutil.move(first.with_suffix(".aside"), first)


def _overlord_up(config, *flags: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "flight_overlord.deploy.cli", "up", str(config), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    address = proc.stdout.readline().strip()  # printed once every role is ready
    assert address.startswith("grpc://127.0.0.1:"), (address, proc.poll())
    return proc, address


def test_ctrl_c_of_overlord_up_and_resume_under_running_trainers_changes_no_stream(reference, corpus, tmp_path,
                                                                                  caplog):
    expected, _ = reference
    caplog.set_level(logging.WARNING, logger="flight_overlord.client")
    config = write_config(tmp_path, corpus, prefetch=PREFETCH)  # network.planner_port: 0, the default
    assert load_config(config).network.planner_port == 0
    reached = threading.Event()

    def on_table(rank, client, table):
        step = table.column("step")[0].as_py()
        if step == 8:
            reached.set()
        time.sleep(SLOW_STEP)  # the trainers are mid-run when the data plane goes down
        return step, step_digest(table)

    up, address = _overlord_up(config)
    trainers = got = None
    try:
        got = {}
        trainers = threading.Thread(target=lambda: got.update(harness.train(address, 2, 0, STEPS, on_table=on_table,
                                                                             prefetch=PREFETCH)))
        trainers.start()
        assert reached.wait(120)
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0
        up, again = _overlord_up(config, "--resume")
        assert again == address  # where the trainers look
        trainers.join(300)
        assert not trainers.is_alive()
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
    assert got == expected  # no trainer raised (harness.train would have), every stream undisturbed
    waits = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    # the outage was said: what (a step, a ticket), where (the constructor's or the Planner's address), since when
    assert any(" at grpc://127.0.0.1:" in w and " since " in w for w in waits), waits


def test_a_constructors_rank_stream_exchange_refuses_bad_input_and_stays_up(idle_cluster):
    """``do_exchange`` at a constructor (TrainerClient's rank stream with credits): anything but a rank
    ticket as the command, or a malformed credit, is a clear error; the constructor answers after."""
    planner = connect(idle_cluster.planner, idle_cluster.credentials)
    info = planner.get_flight_info(fl.FlightDescriptor.for_path("rank", "0", "0"))
    batch = planner.get_flight_info(fl.FlightDescriptor.for_path("batch", "0", "0")).endpoints[0].ticket
    planner.close()
    endpoint = info.endpoints[0]
    constructor = connect(endpoint.locations[0].uri.decode(), idle_cluster.credentials)

    def refusal(descriptor, credit: bytes | None = None) -> str:
        writer, reader = constructor.do_exchange(descriptor)
        if credit is not None:
            writer.write_metadata(credit)
        with pytest.raises(fl.FlightError) as info:
            while True:
                reader.read_chunk()
        with contextlib.suppress(fl.FlightError):  # the call ended with the refusal: closing says it again
            writer.close()
        return str(info.value)
    try:
        assert "takes a rank ticket as the descriptor's command" in refusal(fl.FlightDescriptor.for_path("rank"))
        assert "ticket" in refusal(fl.FlightDescriptor.for_command(b"not json"))
        assert "takes a rank stream ticket" in refusal(fl.FlightDescriptor.for_command(batch.ticket))
        assert "malformed credit" in refusal(fl.FlightDescriptor.for_command(endpoint.ticket.ticket), b'{"upto": "x"}')
        assert wire.call(constructor, "status")["index"] == 0
    finally:
        constructor.close()
