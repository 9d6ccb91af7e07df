"""Failure is normal input: kill -9 a role mid-run (or the whole cluster, then --resume) and every
rank's stream must equal the stream of an undisturbed run with the same config and seed."""
from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pyarrow.flight as fl
import pytest

from flight_overlord import harness, wire
from flight_overlord.config import ConfigError, load_config
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.deploy.node import PORTS_FILE, previous_ports
from flight_overlord.harness import step_digest
from flight_overlord.journal import archive_path
from flight_overlord.planner.audit import offline_audit
from flight_overlord.wire.server import ROLE_DOWN_ENV

from ..helpers import image_graph_config, journal, train, write_config

STEPS = 60  # a 60-step run, killed at a random step


def config(directory, corpus, **overrides):
    """One process per loader actor (``loader-SOURCE-ACTOR``: the kills below are of one actor's
    process) unless a test sets ``loader.hosts``."""
    overrides.setdefault("checkpoint", {"every": 8})
    overrides["loader"] = {"hosts": 0, **overrides.get("loader", {})}
    return write_config(directory, corpus, loaders={"captions": 2}, **overrides)


def run(path, *, kill: str | None = None, at: int = 0, report: bool = False, check=None) -> dict[int, list]:
    """An undisturbed run, or one where role ``kill`` gets SIGKILL when rank 0 reaches step ``at``;
    ``check(cluster)`` runs before the cluster stops."""
    def drive(planner, on_step):
        return train(planner, 0, STEPS, report=report, on_step=on_step)
    return run_killing(path, {at: kill} if kill else {}, drive, check=check)


def run_killing(path, kills: dict[int, str], drive, *, check=None, before_kill=None):
    """``drive(planner, on_step)`` on a fresh cluster, its trainers calling ``on_step(rank, step)``; role
    ``kills[step]`` gets SIGKILL when rank 0 reaches that step (``before_kill(cluster, role)`` first).
    Waits for every killed role to be back; ``check(cluster)`` runs before the cluster stops."""
    with LocalCluster(path) as cluster:
        fired = set()

        def on_step(rank: int, step: int) -> None:
            if rank == 0 and step in kills and step not in fired:
                fired.add(step)
                if before_kill is not None:
                    before_kill(cluster, kills[step])
                cluster.kill(kills[step])
        streams = drive(cluster.planner, on_step)
        for role in kills.values():
            cluster.wait_restarted(role)  # a shadowed loader's run need not wait for its restart
        if check is not None:
            check(cluster)
    assert fired == set(kills), f"the run never reached the steps of kills {sorted(set(kills) - fired)}"
    return streams


@pytest.fixture(scope="module")
def reference(recovery_reference):
    return recovery_reference


@pytest.mark.parametrize("role, seed", [("loader-captions-1", 1), ("loader-code-0", 2), ("planner", 3),
                                        ("constructor-0", 4), ("constructor-1", 5)])
def test_kill_9_of_a_role_changes_no_rank_stream(reference, corpus, tmp_path, role, seed):
    at = int(np.random.default_rng(seed).integers(3, STEPS - 10))
    path = config(tmp_path, corpus)
    assert run(path, kill=role, at=at) == reference
    # overlord audit, from what the constructors recorded as served, agrees with the trainers' own count
    report = offline_audit(load_config(path).run_dir)
    delivered = sum(len(mb) for stream in reference.values() for _, (mbs, _) in stream for mb in mbs)
    assert (report["samples"], report["duplicates"], report["missing"]) == (delivered, 0, 0)


def test_kill_9_of_the_planner_with_a_hot_standby_changes_no_rank_stream(reference, corpus, tmp_path):
    """planner.standbys: 1: the standby takes the Planner's address over (no process start), and a new
    standby follows it; the rank streams are the undisturbed run's."""
    took_over = {}

    def standby_took_over(cluster):
        standby = cluster.child("planner-standby")
        took_over.update(respawned=len(standby.restarts), alive=standby.process.poll() is None,
                         planner_restarts=len(cluster.child("planner").restarts))
    path = config(tmp_path, corpus, planner={"standbys": 1})
    assert run(path, kill="planner", at=19, check=standby_took_over) == reference
    assert took_over == {"respawned": 1, "alive": True, "planner_restarts": 1}


def test_kill_9_of_a_loader_with_a_shadow_fails_over(reference, corpus, tmp_path):
    served = {}

    def shadow_served(cluster):
        client = fl.connect(cluster.child("loader-longdocs-0-shadow1").location)
        served.update(wire.call(client, "status"))
        client.close()
    path = config(tmp_path, corpus, loader={"shadows": 1})
    assert run(path, kill="loader-longdocs-0", at=11, check=shadow_served) == reference  # shadows change no stream
    assert served["bytes_served"] > 0, "constructors did not fail over to the shadow"
    assert served["demanded"] >= 0, "the shadow did not follow the active loader's read-ahead"


def test_full_cluster_kill_then_resume_continues_exactly(reference, corpus, tmp_path):
    path = config(tmp_path, corpus)
    cut = 17
    with LocalCluster(path) as cluster:
        first = train(cluster.planner, 0, cut)
        for child in cluster.children:  # the whole cluster dies at once
            child.process.kill()
    _tear_journal(load_config(path).run_dir / "plan-journal.jsonl")
    with pytest.raises(ConfigError, match="--resume"):
        LocalCluster(path).start()  # a fresh start never silently reuses (or wipes) a run
    with LocalCluster(path, mode="resume") as cluster:
        rest = train(cluster.planner, cut, STEPS)
    assert {r: first[r] + rest[r] for r in first} == reference


def test_resume_with_a_dynamic_schedule_replays_the_feedback(corpus, tmp_path):
    (tmp_path / "dyn.py").write_text(
        "from flight_overlord.orchestration import dynamic, loss_weighted\n"
        "def build(s):\n"
        "    return s.mix(dynamic(loss_weighted({'captions': 1, 'longdocs': 1, 'code': 1, 'docstrings': 1,"
        " 'manuals': 1, 'qa': 1}, temperature=0.5), lag=2))\n")
    undisturbed = run(config(tmp_path / "a", corpus, strategy=str(tmp_path / "dyn.py")), report=True)
    path = config(tmp_path / "b", corpus, strategy=str(tmp_path / "dyn.py"))
    with LocalCluster(path) as cluster:
        first = train(cluster.planner, 0, 21, report=True)
        for child in cluster.children:
            child.process.kill()
    with LocalCluster(path, mode="resume") as cluster:
        rest = train(cluster.planner, 21, STEPS, report=True)
    assert {r: first[r] + rest[r] for r in first} == undisturbed
    weights = {json.dumps(r["weights"], sort_keys=True) for r in _plans(path)}
    assert len(weights) > 3, "the dynamic schedule never moved the weights"


def test_resume_on_a_larger_data_parallel_mesh_delivers_each_sample_once(corpus, tmp_path):
    path = config(tmp_path, corpus)
    cut = 15
    with LocalCluster(path) as cluster:
        before = train(cluster.planner, 0, cut)
        # Plan past the checkpoint for sure (prefetch may not have got there yet): a stock client
        # takes step `cut`'s ticket, which plans and journals it, and never redeems it.
        stock = fl.connect(cluster.planner)
        stock.get_flight_info(fl.FlightDescriptor.for_path("batch", str(cut), "0"))
        stock.close()
        for child in cluster.children:
            child.process.kill()
    planned_ahead = [k for r in _plans(path) if r["step"] >= cut for b in r["bins"] for k in b]
    assert planned_ahead, "the Planner had planned past the checkpoint"
    # dp 2 -> 4, the same global batch: a new layout, so plans from the checkpoint on are made again
    config(tmp_path, corpus, mesh={"dp": 4})
    with LocalCluster(path, mode="resume") as cluster:
        after = train(cluster.planner, cut, cut + 12, ranks=4)
    delivered_before = [(k, s) for r in before for s, (mbs, _) in before[r] for mb in mbs for k in mb]
    delivered_after = [(k, s) for r in after for s, (mbs, _) in after[r] for mb in mbs for k in mb]
    epochs = _epochs(path)
    occurrences = [(k, epochs[(s, k)]) for k, s in delivered_before + delivered_after]
    assert len(occurrences) == len(set(occurrences)), "a sample was delivered twice across the resume"
    assert set(planned_ahead) <= {k for k, _ in delivered_after}, "planned-but-undelivered samples were lost"
    report = offline_audit(load_config(path).run_dir)  # the audit across the dp change agrees
    assert (report["samples"], report["duplicates"], report["missing"]) == (len(occurrences), 0, 0)
    assert report["segments"] == 2 and report["through_step"] == cut + 11


def _plans(path) -> list[dict]:
    return journal(path)


def _epochs(path) -> dict[tuple[int, str], int]:
    """(step, key) -> epoch, from the journal (the last record of a step wins, as after a rewind)."""
    out = {}
    for record in _plans(path):
        for key, (epoch, *_) in record["samples"].items():
            out[(record["step"], key)] = epoch
    return out


def _tear_journal(path) -> None:
    """A crash mid-write leaves half a line at the end of the journal."""
    with open(path, "a") as f:
        f.write('{"step": 99999, "layout": {"axis": "DP", "bu')


def test_loader_hosts_serve_the_same_streams_from_fewer_processes(reference, corpus, tmp_path):
    """Seven loader actors (six sources, captions split in two) in two processes: every rank's
    stream equals the one-process-per-actor run's, and only two loader processes run."""
    path = config(tmp_path, corpus, loader={"hosts": 2})
    hosted = {}

    inspected = {}

    def count(cluster):
        loaders = [c for c in cluster.children if c.name.startswith("loader")]
        hosted.update({c.name: c.args[c.args.index("--actors") + 1] for c in loaders})
        planner = fl.connect(cluster.planner)  # a stock client's source inspection, through the hosts
        for source in ("captions", "longdocs", "code", "docstrings", "manuals", "qa"):
            info = planner.get_flight_info(fl.FlightDescriptor.for_path("source", source))
            inspected[source] = [k for e in info.endpoints for k in fl.connect(e.locations[0].uri.decode())
                                 .do_get(e.ticket).read_all().column("key").to_pylist()]
        planner.close()
    assert run(path, check=count) == reference
    assert sorted(hosted) == ["loader-host0", "loader-host1"]
    assert sum(map(len, inspected.values())) > 0  # each source's buffer, only its own samples
    assert all(k.startswith(f"{source}:") for source, keys in inspected.items() for k in keys), inspected
    assert sorted(a for actors in hosted.values() for a in actors.split(",")) == sorted(
        ["captions:0", "captions:1", "longdocs:0", "code:0", "docstrings:0", "manuals:0", "qa:0"])


def test_kill_9_of_a_loader_host_brings_all_its_sources_back(reference, corpus, tmp_path):
    assert run(config(tmp_path, corpus, loader={"hosts": 2}), kill="loader-host0", at=13) == reference


def test_kill_9_of_a_loader_host_and_the_planner_with_the_host_back_on_a_new_address(reference, corpus, tmp_path,
                                                                                   monkeypatch):
    """A loader host and the Planner get kill -9 together; the host comes back on a NEW port (as a
    rescheduled pod does) only after the Planner is back with --recover and the host's old registration,
    so the recovered Planner's metadata fetches and the constructors' plans start at the old address.
    They find the host where it re-registered: every rank's stream is the undisturbed run's. An
    unreachable role counts as down after 30 s here (not 120 s): a fetch that keeps to the old address
    fails the run in bounded time."""
    monkeypatch.setenv(ROLE_DOWN_ENV, "30")  # the roles' processes inherit it
    path = config(tmp_path, corpus, loader={"hosts": 2})
    new_port = socket.socket()  # held (bound, no SO_REUSEPORT): the host's restarts fail to bind it until
    new_port.bind(("127.0.0.1", 0))  # it is let go, after the Planner is back (the pod is being rescheduled)
    addresses = {}

    def before_kill(cluster, role):
        host = cluster.child("loader-host0")
        addresses["before"] = host.location
        host.location = addresses["new"] = f"{host.location.rsplit(':', 1)[0]}:{new_port.getsockname()[1]}"
        cluster.kill("loader-host0")

        def let_go():
            try:
                cluster.wait_restarted("planner")
                time.sleep(1.0)  # the Planner plans, constructors fetch: at the host's old address
            finally:
                new_port.close()
        threading.Thread(target=let_go, name="reschedule", daemon=True).start()

    def moved(cluster):
        cluster.wait_restarted("loader-host0")
        addresses["after"] = cluster.child("loader-host0").ready_file.read_text()

    def drive(planner, on_step):
        return train(planner, 0, STEPS, on_step=on_step)
    with new_port:  # closed (if the kill never came) whatever happens
        assert run_killing(path, {13: "planner"}, drive, before_kill=before_kill, check=moved) == reference
    assert addresses["after"] == addresses["new"] != addresses["before"]


@pytest.mark.parametrize("ports_file", ["kept", "unreadable"])
def test_single_node_is_one_process_and_its_kill_9_changes_no_rank_stream(reference, corpus, tmp_path, ports_file):
    """``deployment: single_node``: the Planner, both loader hosts and the constructor in one process
    (``overlord serve node``), each on its own port; a kill -9 of that process (every role at once),
    restarted with --recover on the same ports, leaves every rank's stream the undisturbed run's. With
    ``node-ports.json`` unreadable (here: torn) the restart says so and takes the ports from the
    Planner's registrations: the same ports, the same streams."""
    path = config(tmp_path, corpus, deployment="single_node", loader={"hosts": 2})
    ports_path = load_config(path).run_dir / PORTS_FILE
    processes, before = [], []

    def before_kill(cluster, role):
        before.append(previous_ports(load_config(path)))
        if ports_file == "unreadable":
            ports_path.write_text(ports_path.read_text()[:-5])

    def drive(planner, on_step):
        return train(planner, 0, STEPS, on_step=on_step)
    assert run_killing(path, {17: "node"}, drive, before_kill=before_kill,
                       check=lambda c: processes.extend(c.children)) == reference
    assert [(c.name, len(c.restarts)) for c in processes] == [("node", 1)]
    after = previous_ports(load_config(path))
    assert sorted(after) == sorted(before[0]) == ["constructor-0", "loader-host0", "loader-host1", "planner"]
    said = f"{ports_path} is unreadable" in processes[0].log_path.read_text()
    assert said == (ports_file == "unreadable")
    assert after == before[0]


@pytest.mark.parametrize("role", ["planner", "constructor-1"])
def test_kill_9_after_the_plan_journal_was_compacted_changes_no_rank_stream(reference, corpus, tmp_path, role):
    """checkpoint.every: 2 snapshots the Planner every second step, so the plan journal is compacted
    into its archive early (step ~12: older records go once they outweigh the newest four snapshots').
    A kill -9 after that restarts from a snapshot and the compacted file's tail: same streams."""
    path = config(tmp_path, corpus, checkpoint={"every": 2})
    archive = archive_path(load_config(path).run_dir / "plan-journal.jsonl")
    archived_at_kill = []

    def drive(planner, on_step):
        return train(planner, 0, STEPS, on_step=on_step)
    streams = run_killing(path, {31: role}, drive,
                          before_kill=lambda cluster, _: archived_at_kill.append(
                              archive.exists() and archive.stat().st_size))
    assert archived_at_kill[0], "the journal was not compacted before the kill"
    assert streams == reference


ENCODER_STEPS = 14


def encoder_streams(planner: str, on_step=None) -> dict[int, list]:
    """Every rank of the image-graph config through ``TrainerClient(encoder=True)``: per rank and step,
    (step, digest of its microbatches, digest of its encoder inputs: keys, images, pixels)."""
    def on_table(rank, client, tables):
        batch, encoder = tables
        step = batch.column("step")[0].as_py()
        if on_step is not None:
            on_step(rank, step)
        pixels = encoder.column("pixel_values").combine_chunks().values.to_numpy(zero_copy_only=False)
        return step, step_digest(batch), (tuple(encoder.column("sample_key").to_pylist()),
                                          tuple(encoder.column("image_index").to_pylist()),
                                          harness.blake(pixels.tobytes()))
    return harness.train(planner, 4, 0, ENCODER_STEPS, on_table=on_table, encoder=True)


@pytest.fixture(scope="module")
def encoder_reference(corpus, tmp_path_factory):
    return run_killing(image_graph_config(tmp_path_factory.mktemp("vlm-reference"), corpus), {},
                       lambda planner, on_step: encoder_streams(planner))


def test_kill_9_with_encoder_rank_streams_changes_neither_stream_of_any_rank(encoder_reference, corpus, tmp_path):
    """Image graph, every rank on both rank streams (batch and encoder-rank): kill -9 of a constructor
    mid-run, then of the Planner (a hot standby takes over); both streams of every rank equal the
    undisturbed run's."""
    path = image_graph_config(tmp_path, corpus, planner={"standbys": 1})
    streams = run_killing(path, {4: "constructor-0", 9: "planner"}, encoder_streams)
    assert sum(len(keys) for stream in encoder_reference.values() for _, _, (keys, _, _) in stream) > 4
    assert streams == encoder_reference
