"""Closed-loop balancing end to end: trainers report their measured compute (here simulated from a
true quadratic cost the config does not know), the Planner fits the cost model from the reports and
balances with it. Real servers, real clients; the fitting logic alone: tests/unit/test_costfit.py."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from flight_overlord.client import TrainerClient
from flight_overlord.config import load_config
from flight_overlord.core.costfit import CostFit, Fitted
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.deploy.status import cluster_status, render

from ..helpers import each_rank, journal, journal_records, write_config

RANKS, STEPS, LAG = 4, 44, 4
TRUE_A, TRUE_B = 2e-6, 2e-6 / 256  # seconds per token, per token squared: b/a = 1/256


def true_seconds(lengths: list[int]) -> float:
    length = np.asarray(lengths, dtype=np.float64)
    return float(TRUE_A * length.sum() + TRUE_B * (length * length).sum())


def measured(step: int, rank: int, microbatch: int, lengths: list[int]) -> float:
    """What a rank's timer reads: the true cost, +-3% jitter, and now and then a 5x stall (a GC
    pause) the fit must reject; a pure function of (step, rank, microbatch), so runs report alike."""
    h = int.from_bytes(hashlib.blake2b(f"{step}/{rank}/{microbatch}".encode(), digest_size=8).digest(), "little")
    jitter = 1 + 0.03 * ((h % 2001) / 1000 - 1)
    stall = 5.0 if h % 37 == 0 else 1.0
    return true_seconds(lengths) * jitter * stall


def lengths_of(mb: dict) -> list[int]:
    return np.diff(mb["cu_seqlens"].numpy()).tolist()


def train(planner: str, rank: int, first: int, last: int, costs: dict) -> None:
    with TrainerClient(planner, rank, start_step=first, num_steps=last - first, timeout=60) as client:
        for batch in client:
            step = batch[0]["step"]
            costs[(step, rank)] = sum(true_seconds(lengths_of(mb)) for mb in batch)
            client.report(step, compute_seconds=[measured(step, rank, i, lengths_of(mb)) for i, mb in enumerate(batch)])


def run(planner: str, first: int, last: int) -> dict:
    """Every rank trains steps [first, last): {(step, rank): true seconds of the rank's step}."""
    costs: dict = {}
    each_rank(lambda address, rank: train(address, rank, first, last, costs), planner, RANKS, timeout=180)
    assert len(costs) == RANKS * (last - first), "a trainer did not finish"
    return costs


def fit_config(directory, corpus):
    return write_config(directory, corpus, mesh={"dp": RANKS}, cost={"model": "attention", "a": 1.0, "b": 0.0,
                                                                     "fit": True, "lag": LAG},
                        global_batch={"context_length": 1024, "microbatches": 2, "tokens_per_step": 7000})


@pytest.fixture(scope="module")
def undisturbed(corpus, tmp_path_factory):
    """A 4-rank run of 44 steps with a linear (b = 0) config and quadratic ranks; its status at the end."""
    path = fit_config(tmp_path_factory.mktemp("costfit"), corpus)
    with LocalCluster(path) as cluster:
        costs = run(cluster.planner, 0, STEPS)
        status = cluster_status(cluster.planner)
    return path, costs, status


def imbalance(costs: dict, steps) -> float:
    """Mean over ``steps`` of the slowest rank's true seconds over the mean rank's."""
    return float(np.mean([max(costs[(s, r)] for r in range(RANKS)) / np.mean([costs[(s, r)] for r in range(RANKS)])
                          for s in steps]))


def test_fitted_model_finds_the_true_ratio_and_balances_the_true_cost(undisturbed):
    path, costs, status = undisturbed
    fits = [r["cost_fit"] for r in journal_records(path) if "cost_fit" in r]
    assert fits[0]["step"] == 0 and not fits[0]["fitted"] and fits[0]["b"] == 0.0  # the config's model first
    final = [f for f in fits if f["step"] <= STEPS - 1][-1]
    assert final["fitted"] and final["rejected"] > 0  # the stalls were rejected
    assert final["b"] / final["a"] == pytest.approx(TRUE_B / TRUE_A, rel=0.2)
    first, last = imbalance(costs, range(LAG)), imbalance(costs, range(STEPS - 8, STEPS))
    assert last < first, (first, last)
    # The model in force, for people and machines.
    cost = status["cost"]
    assert cost["fit"] and cost["fitted"] and cost["b"] / cost["a"] == pytest.approx(TRUE_B / TRUE_A, rel=0.2)
    assert "fitted from" in render(status)


def test_same_reports_give_the_same_fits(undisturbed):
    """The journaled timings alone give every journaled fit again (in any arrival order)."""
    path, _, _ = undisturbed
    records = journal_records(path)
    rows = [r["compute"] for r in records if "compute" in r]
    cfg = load_config(path)
    forward, backward = (CostFit(1.0, 0.0, lag=LAG, window=cfg.cost.window, buckets=RANKS) for _ in range(2))
    for c in rows:
        forward.add(c["step"], c["bucket"], c["rows"])
    for c in reversed(rows):
        backward.add(c["step"], c["bucket"], c["rows"])
    for record in (r["cost_fit"] for r in records if "cost_fit" in r):
        fields = {k: v for k, v in record.items() if k not in ("step", "fitted", "model")}
        assert forward.fit_for(record["step"]) == Fitted(**fields) == backward.fit_for(record["step"])


def test_resume_across_a_fit_change_gives_the_undisturbed_plans(undisturbed, corpus, tmp_path):
    path_a, _, _ = undisturbed
    path = fit_config(tmp_path, corpus)
    stop, end = 9, 16  # the fit changes at every step from LAG on: the stop is between two models
    with LocalCluster(path) as cluster:
        run(cluster.planner, 0, stop)
    with LocalCluster(path, mode="resume") as cluster:
        run(cluster.planner, stop, end)
    ours = {r["step"]: r["bins"] for r in journal(path)}
    theirs = {r["step"]: r["bins"] for r in journal(path_a)}
    assert [ours[s] for s in range(end)] == [theirs[s] for s in range(end)]
    fits = [r["cost_fit"] for r in journal_records(path) if "cost_fit" in r]
    assert any(f["step"] < stop and f["fitted"] for f in fits) and any(f["step"] > stop for f in fits)
