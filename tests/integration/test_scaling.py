"""Live scaling (loader.scaling): a staged schedule moves weight onto ``code`` and back; the Planner
adds an actor for it mid-run and reclaims it, resharding its row groups live, and every rank's
stream equals the run with scaling off, through a kill -9 of a loader host and a full resume."""
from __future__ import annotations

import json

import pytest

from flight_overlord import wire
from flight_overlord.config import load_config
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.deploy.status import cluster_status, render
from flight_overlord.journal import read_journal
from flight_overlord.wire.server import connect

from ..helpers import WEIGHTS, journal, journal_records, train, write_config

STEPS = 40
HEAVY = {name: (0.8 if name == "code" else 0.04) for name in WEIGHTS}  # code: 0.2 -> 0.8 -> 0.2
SCALING = {"interval": 3, "up_threshold": 0.5, "down_threshold": 0.2, "consecutive": 2, "max_actors": 2,
           "sources": ["code", "qa"]}  # only these get an idle actor; qa never needs it
# intervals end at steps 2, 5, 8, ...: code is over 0.5 per actor in [9, 11] and [12, 14] -> up at 14;
# back to 0.2 (0.1 per actor) in [27, 29] and [30, 32] -> down at 32
EXPECTED = [(14, "code", 1, 2), (32, "code", 2, 1)]


def config(directory, corpus, *, enabled: bool, shadows: int = 0):
    directory.mkdir(parents=True, exist_ok=True)
    strategy = directory / "staged.py"
    strategy.write_text("from flight_overlord.orchestration import staged\n"
                        f"def build(s):\n"
                        f"    return s.mix(staged([(0, {WEIGHTS!r}), (8, {HEAVY!r}), (26, {WEIGHTS!r})]))\n")
    return write_config(directory, corpus, strategy=str(strategy), checkpoint={"every": 8},
                        loader={"hosts": 2, "shadows": shadows, "scaling": {"enabled": enabled, **SCALING}})


def events(path) -> list[tuple]:
    return [(e["step"], e["source"], e["previous"], e["actors"])
            for r in journal_records(path) for e in r.get("scaling", [])]


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    path = config(tmp_path_factory.mktemp("unscaled"), corpus, enabled=False)
    with LocalCluster(path) as cluster:
        streams = train(cluster.planner, 0, STEPS)
    assert events(path) == []
    return streams


@pytest.fixture(scope="module")
def scaled(corpus, tmp_path_factory):
    path = config(tmp_path_factory.mktemp("scaled"), corpus, enabled=True)
    with LocalCluster(path) as cluster:
        streams = train(cluster.planner, 0, STEPS)
        status = cluster_status(cluster.planner, credentials=cluster.credentials)
    return path, streams, status


def test_an_actor_is_added_and_reclaimed_mid_run(scaled):
    path, _, status = scaled
    assert events(path) == EXPECTED  # in the plan journal, with the plans of those steps
    scaling = status["planner"]["counters"]["scaling"]
    assert [(e["step"], e["source"], e["previous"], e["actors"]) for e in scaling["events"]] == EXPECTED
    assert scaling["actors"]["code"] == 1 and len(scaling["segments"]["code"]) == 3
    assert "code 1 -> 2 actors" in render(status)
    served = {(lo["source"], lo["actor"]): lo["counters"]["bytes_served"] for lo in status["loaders"]}
    assert served[("code", 1)] > 0, "the added actor served nothing"
    assert served[("qa", 1)] == 0, "an idle actor served"
    assert sorted(served) == sorted([(s, 0) for s in WEIGHTS] + [("code", 1), ("qa", 1)])  # loader.scaling.sources
    added = load_config(path).run_dir / "loaders" / "code-1" / "journal.jsonl"
    assert any("segments" in r for _, r in read_journal(added)), "the reshard is not in the actor's journal"
    code1 = next(lo for lo in status["loaders"] if (lo["source"], lo["actor"]) == ("code", 1))
    assert code1["counters"]["row_groups_owned"] == 0  # reclaimed: owns nothing past the last boundary
    logs = "".join(p.read_text() for p in (load_config(path).run_dir / "logs").glob("loader-*.log"))
    assert "resharded" in logs and "behind this actor's reads" not in logs  # no buffered row group changed hands


def test_every_rank_stream_equals_the_unscaled_run(reference, scaled):
    assert scaled[1] == reference


def test_nothing_lost_or_duplicated_through_the_reshards(scaled):
    path, streams, _ = scaled
    plans = {r["step"]: r for r in journal(path)}
    seen = set()
    for step in range(STEPS):
        delivered = [k for r in streams for s, (mbs, _) in streams[r] if s == step for mb in mbs for k in mb]
        planned = [k for b in plans[step]["bins"] for k in b]
        assert sorted(delivered) == sorted(planned) and len(set(delivered)) == len(delivered), step
        for key in delivered:
            occurrence = (key, plans[step]["samples"][key][0])  # (key, epoch): once per epoch
            assert occurrence not in seen, occurrence
            seen.add(occurrence)


def test_kill_9_of_a_loader_host_after_a_scale_up_then_a_full_resume(reference, corpus, tmp_path):
    """loader-host0 hosts code[0] and the added code[1] (with a shadow: constructors fail over to it):
    killed just after the scale-up (and the Planner a few steps later); the whole cluster dies at step
    24 and resumes from the journals; loader-host0 is killed again just after the scale-down."""
    path = config(tmp_path, corpus, enabled=True, shadows=1)
    cut = 24
    with LocalCluster(path) as cluster:
        assert "code:1" in cluster.child("loader-host0").args[cluster.child("loader-host0").args.index("--actors") + 1]
        fired = set()

        def on_step(rank: int, step: int) -> None:
            if rank == 0 and step in (16, 20) and step not in fired:
                fired.add(step)
                cluster.kill("loader-host0" if step == 16 else "planner")
        first = train(cluster.planner, 0, cut, on_step=on_step)
        cluster.wait_restarted("loader-host0")  # with a shadow the run need not wait for it: wait here
        cluster.wait_restarted("planner")
        shadow = connect(cluster.child("loader-host0-shadow1").location, cluster.credentials)
        actors = {(a["source"], a["actor"]): a for a in wire.call(shadow, "status")["actors"]}
        shadow.close()
        assert actors[("code", 1)]["segments"] == [[0, 1], [6, 2]], "the shadow does not own what code[1] owns"
        for child in cluster.children:
            child.process.kill()
    with LocalCluster(path, mode="resume") as cluster:
        kills = set()

        def again(rank: int, step: int) -> None:
            if rank == 0 and step == 34 and not kills:
                kills.add(step)
                cluster.kill("loader-host0")
        rest = train(cluster.planner, cut, STEPS, on_step=again)
        cluster.wait_restarted("loader-host0")
    assert {r: first[r] + rest[r] for r in first} == reference
    assert events(path) == EXPECTED, json.dumps(events(path))
    logs = "".join(p.read_text() for p in (load_config(path).run_dir / "logs").glob("loader-*.log"))
    assert "behind this actor's reads" not in logs
