"""Orchestration end to end on real servers: a 4D mesh, dynamic (feedback-driven) mixing, and a
constructor hook reordering microbatches. The logic alone (mesh, context-parallel splits, schedules,
strategy primitives, the step program): tests/unit/test_orchestration_logic.py."""
from __future__ import annotations

import collections

import numpy as np
import pyarrow.parquet as pq
import pytest

from flight_overlord.client import StepFetcher, TrainerClient
from flight_overlord.config import load_config
from flight_overlord.core.context_parallel import reassemble
from flight_overlord.core.mesh import Coord, Mesh
from flight_overlord.core.schedules import FeedbackLog, weights_at
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.harness import fetch_steps
from flight_overlord.planner.strategy import load_strategy

from ..helpers import WEIGHTS, delivered_keys, each_rank, journal, journal_records, write_config

# -- end to end --------------------------------------------------------------------------
STRATEGY_4D = """
from flight_overlord.orchestration import linear
def build(s):
    return (s.mix(linear({first}, {second}, start=0, end=6)).cost("attention")
             .distribute("DP").balance("karmarkar_karp", level="both").broadcast_at("TP"))
"""


def test_4d_mesh_end_to_end(corpus, tmp_path):
    """pp=2 x dp=2 x cp=2 x tp=2, read with a stock Flight client: the first stage's TP rank 0 gets
    tokens and positions, the last stage's labels and loss mask (the next tokens of the same samples),
    TP ranks above 0 metadata only; CP shares reassemble to sequences
    whose samples are the Parquet bytes, every sample reaches one data-parallel group once, and the
    curriculum's mixture is what the trainers got."""
    second = {"captions": 0.05, "longdocs": 0.5, "code": 0.15, "docstrings": 0.1, "manuals": 0.1, "qa": 0.1}
    (tmp_path / "s4d.py").write_text(STRATEGY_4D.format(first=WEIGHTS, second=second))
    path = write_config(tmp_path, corpus, strategy="s4d.py", mesh={"pp": 2, "dp": 2, "cp": 2, "tp": 2},
                        global_batch={"context_length": 1024, "microbatches": 2, "tokens_per_step": 3600})
    cfg, mesh, steps = load_config(path), Mesh(2, 2, 2, 2), 8
    with LocalCluster(path) as cluster:
        run = fetch_steps(cluster.planner, 16, 0, steps)
    L = cfg.global_batch.context_length
    for step in range(steps):
        for dp in range(2):
            ranks = [r for r in range(16) if mesh.coord(r).dp == dp]
            keys = run[ranks[0]][step].column("sample_keys")
            pieces, last = [], []
            for r in ranks:
                c, table = mesh.coord(r), run[r][step]
                assert table.column("sample_keys").equals(keys) and table.column("cu_seqlens").to_pylist()
                held = {name: [len(x) for x in table.column(name).to_pylist()]
                        for name in ("input_ids", "position_ids", "labels", "loss_mask", "token_ranges")}
                if c.tp > 0:  # broadcast_at("TP"): metadata only
                    assert not any(n for lengths in held.values() for n in lengths)
                elif c.pp == 0:  # the first stage: tokens and positions, no labels
                    assert held["input_ids"] == held["position_ids"] == [L // 2] * table.num_rows
                    assert not any(held["labels"] + held["loss_mask"])
                    pieces.append(table)
                else:  # the last stage: labels and loss mask of the same positions, no tokens
                    assert held["labels"] == held["loss_mask"] == [L // 2] * table.num_rows
                    assert not any(held["input_ids"] + held["position_ids"])
                    last.append(table)
            assert len(pieces) == len(last) == 2  # the two CP ranks of each stage, TP rank 0
            for m in range(pieces[0].num_rows):
                full = reassemble([(np.array(p.column("input_ids")[m].as_py()), p.column("token_ranges")[m].as_py())
                                   for p in pieces], L)
                labels = reassemble([(np.array(p.column("labels")[m].as_py()), p.column("token_ranges")[m].as_py())
                                     for p in last], L)
                mask = reassemble([(np.array(p.column("loss_mask")[m].as_py()), p.column("token_ranges")[m].as_py())
                                   for p in last], L)
                assert np.array_equal(mask, labels != -100)
                assert_next_tokens(labels, full, pieces[0].column("cu_seqlens")[m].as_py(),
                                   pieces[0].column("cu_seqlens_padded")[m].as_py())
                lengths = np.diff(pieces[0].column("cu_seqlens")[m].as_py())
                slots = pieces[0].column("cu_seqlens_padded")[m].as_py()  # THD: each sample in its own slot
                assert all(b - a >= n and (b - a) % 4 == 0 for a, b, n in zip(slots, slots[1:], lengths))
                for key, start, n in list(zip(keys[m].as_py(), slots[:-1], lengths))[::7]:
                    source, file, rg, row = key.split(":")
                    text = pq.ParquetFile(corpus / file).read_row_group(int(rg), columns=["text"]).column(0)[int(row)]
                    assert full[start:start + n].tolist() == list(text.as_py().encode()[:L]), key
    records = journal(path)[:steps]
    planned = [k for rec in records for b in rec["bins"] for k in b]
    delivered = [k for dp in range(2) for k in delivered_keys(run[mesh.rank(Coord(0, dp, 0, 0))])]
    assert collections.Counter(delivered) == collections.Counter(planned) and len(set(delivered)) == len(delivered)
    assert records[0]["weights"] == pytest.approx(WEIGHTS) and records[6]["weights"] == pytest.approx(second)
    late = collections.Counter()
    for rec in records[6:]:
        late.update(rec["stats"]["tokens"])
    assert late["longdocs"] / sum(late.values()) > 0.3  # the curriculum moved the mixture


def assert_next_tokens(labels: np.ndarray, tokens: np.ndarray, cu_seqlens: list[int], slots: list[int]) -> None:
    """The last stage's labels are the first stage's next tokens within each sample, -100 elsewhere."""
    expected = np.full(len(tokens), -100)
    for start, n in zip(slots[:-1], np.diff(cu_seqlens)):
        expected[start:start + n - 1] = tokens[start + 1:start + n]
    assert np.array_equal(labels, expected)


STRATEGY_DYNAMIC = """
from flight_overlord.orchestration import dynamic, loss_weighted
def build(s):
    return s.mix(dynamic(loss_weighted({weights}, temperature=0.5), lag=2))
"""


def test_dynamic_mixing_moves_weights_and_replays_from_the_journal(corpus, tmp_path):
    (tmp_path / "dyn.py").write_text(STRATEGY_DYNAMIC.format(weights=WEIGHTS))
    path = write_config(tmp_path, corpus, strategy="dyn.py")
    steps = 8

    def train(planner, rank):  # reports longdocs as the hard source
        with TrainerClient(planner, rank, num_steps=steps, timeout=60) as client:
            for batch in client:
                sources = {k.split(":")[0] for mb in batch for k in mb["sample_keys"]}
                client.report(batch[0]["step"], {s: 3.0 if s == "longdocs" else 1.0 for s in sources})

    with LocalCluster(path) as cluster:
        each_rank(train, cluster.planner, 2)
    lines = journal_records(path)
    plans = {r["step"]: r for r in lines if "step" in r}
    assert plans[0]["weights"] == pytest.approx(WEIGHTS) and "feedback" not in plans[0]
    fed_back = plans[5]["weights"]
    assert fed_back["longdocs"] > 2 * fed_back["captions"] * WEIGHTS["longdocs"] / WEIGHTS["captions"]
    # Replay: the journaled reports alone give every plan's weights again.
    log = FeedbackLog(expected=2)
    for r in lines:
        if "report" in r:
            log.add(r["report"]["step"], r["report"]["group"], r["report"]["losses"])
    schedule = load_strategy(load_config(path)).schedule
    for step, record in plans.items():
        weights, used = weights_at(schedule, step, log)
        assert weights == pytest.approx(record["weights"]) and used == record.get("feedback")


def test_dynamic_mixing_rejects_bad_reports(corpus, tmp_path):
    import pyarrow.flight as fl

    from flight_overlord import wire
    (tmp_path / "dyn.py").write_text(STRATEGY_DYNAMIC.format(weights=WEIGHTS))
    with LocalCluster(write_config(tmp_path, corpus, strategy="dyn.py")) as cluster:
        planner = fl.connect(cluster.planner)
        with pytest.raises(fl.FlightServerError, match="invalid request: .*no source named 'nope'"):
            wire.call(planner, "report", {"step": 0, "rank": 0, "losses": {"nope": 1.0}})
        with pytest.raises(fl.FlightServerError, match="invalid request: .*must be a (finite )?number"):
            wire.call(planner, "report", {"step": 0, "rank": 0, "losses": {"qa": "high"}})
        with pytest.raises(fl.FlightServerError, match="invalid request: .*rank 9 is outside the mesh"):
            wire.call(planner, "report", {"step": 0, "rank": 9, "losses": {"qa": 1.0}})
        assert wire.call(planner, "status", {})["error"] is None


STRATEGY_ORDER = """
def build(s):
    return s.constructor_do_plan(lambda step, bucket, mbs: sorted(range(len(mbs)), key=lambda i: -mbs[i]["num_tokens"]))
"""


def test_constructor_do_plan_reorders_delivered_microbatches(corpus, tmp_path):
    (tmp_path / "order.py").write_text(STRATEGY_ORDER)
    path = write_config(tmp_path, corpus, strategy="order.py",
                        global_batch={"context_length": 1024, "microbatches": 4, "tokens_per_step": 6000})
    with LocalCluster(path) as cluster:
        fetchers = [StepFetcher(cluster.planner, r, timeout=60) for r in range(2)]
        tables = [f.fetch(step) for step in range(3) for f in fetchers]
        for f in fetchers:
            f.close()
    planned = collections.Counter(k for rec in journal(path)[:3] for b in rec["bins"] for k in b)
    assert collections.Counter(delivered_keys(tables)) == planned  # reordered, nothing lost
    for table in tables:
        tokens = table.column("num_tokens").to_pylist()
        assert tokens == sorted(tokens, reverse=True) and table.column("microbatch").to_pylist() == [0, 1, 2, 3]
