"""The fitted cost model's logic (core/costfit.py, planner/costing.py) and the trainer's timer, without
servers. End to end on real servers: tests/integration/test_costfit.py."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from flight_overlord.client import ComputeTimer
from flight_overlord.config import ConfigError, load_config
from flight_overlord.core.costfit import CostFit
from flight_overlord.planner.costing import checked_seconds
from flight_overlord.planner.strategy import load_strategy

from ..helpers import write_config

A, B = 2e-6, 2e-6 / 256


def reports(steps: int, buckets: int = 4, seed: int = 0, stalls: float = 0.05):
    """(step, bucket, rows): packed microbatches of random lengths timed by the true model, with 3%
    noise and a share of 5x stalls."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        for bucket in range(buckets):
            rows = []
            for _ in range(2):
                lengths = rng.integers(16, 1024, size=6)
                lengths = lengths[:max(1, int(np.searchsorted(np.cumsum(lengths), 1024)))]
                y = (A * lengths.sum() + B * (lengths * lengths).sum()) * (1 + 0.03 * rng.standard_normal())
                stalled = 5 if rng.random() < stalls else 1
                rows.append([int(lengths.sum()), int((lengths * lengths).sum()), y * stalled])
            yield step, bucket, rows


def filled(steps: int, **kwargs) -> CostFit:
    fit = CostFit(1.0, 0.0, lag=2, window=64, buckets=4, **kwargs)
    for step, bucket, rows in reports(steps):
        fit.add(step, bucket, rows)
    return fit


def test_the_fit_finds_the_true_ratio_from_a_linear_prior_and_rejects_stalls():
    fit = filled(40).fit_for(41)
    assert fit.fitted and fit.through_step == 39 and fit.rejected > 0
    assert fit.b / fit.a == pytest.approx(B / A, rel=0.1)
    assert fit.a == pytest.approx(A, rel=0.2)  # in seconds: the measured scale


def test_before_lag_steps_of_reports_the_prior_plans():
    fit = filled(40)
    assert fit.fit_for(0) == fit.fit_for(1) == fit.prior and not fit.prior.fitted
    assert fit.fit_for(2).fitted  # step 0's reports, complete


def test_the_prior_holds_a_few_reports_back():
    """One step of reports moves the model less than forty do: the prior is worth a few reports."""
    few, many = filled(1).fit_for(2), filled(40).fit_for(41)
    assert few.b / few.a < many.b / many.a


def test_same_reports_in_any_order_give_the_same_fit_and_state_round_trips():
    rows = list(reports(12))
    fits = []
    for order in (rows, rows[::-1], sorted(rows, key=lambda r: (r[1], -r[0]))):
        fit = CostFit(1.0, 0.0, lag=2, window=8, buckets=4)
        for step, bucket, r in order:
            fit.add(step, bucket, r)
        fits.append([fit.fit_for(s) for s in range(14)])
    assert fits[0] == fits[1] == fits[2]
    original = filled(12)
    restored = CostFit(1.0, 0.0, lag=2, window=64, buckets=4)
    restored.load_state_dict(original.state_dict())
    assert [restored.fit_for(s) for s in range(14)] == [original.fit_for(s) for s in range(14)]


def test_first_report_wins_completeness_and_bounded_state():
    fit = CostFit(1.0, 0.0, lag=2, window=3, buckets=2)
    assert fit.add(0, 0, [[10, 100, 1.0]]) and not fit.add(0, 0, [[10, 100, 9.0]])
    assert not fit.complete(0) and fit.missing(0) == [1] and not fit.ready(2) and fit.ready(1)
    fit.add(0, 1, [[10, 100, 1.0]])
    assert fit.ready(2)
    for step in range(1, 20):
        fit.add(step, 0, [[10, 100, 1.0]])
    fit.forget_before(20)
    assert sorted(fit.reports) == [16, 17, 18, 19]  # what steps >= 20 read: (s - lag - window, s - lag]


def test_compute_seconds_are_checked():
    assert checked_seconds(1.5, 2) == [1.5] and checked_seconds([1, 2], 2) == [1.0, 2.0]
    for bad, match in (([1.0, 2.0, 3.0], "lists 3 microbatches"), (float("nan"), "finite"), (-1.0, ">= 0"),
                       ("fast", "finite numbers"), (True, "finite numbers")):
        with pytest.raises(ValueError, match=match):
            checked_seconds(bad, 2)


def test_compute_timer_times_each_microbatch_and_starts_afresh():
    ticks = itertools.count(0.0, 0.25)
    synced = []
    timer = ComputeTimer(clock=lambda: next(ticks), synchronize=lambda: synced.append(1))
    for _ in range(3):
        with timer.microbatch():
            pass
    assert timer.take() == [0.25, 0.25, 0.25] and timer.take() == [] and len(synced) == 6


def test_fit_config_is_checked(tmp_path, corpus):
    with pytest.raises(ConfigError, match="cost.fit: expected true or false"):
        load_config(write_config(tmp_path, corpus, cost={"fit": "yes"}))
    with pytest.raises(ConfigError, match="cost.lag"):
        load_config(write_config(tmp_path, corpus, cost={"fit": True, "lag": 0}))
    cfg = load_config(write_config(tmp_path, corpus, cost={"model": "tokens", "fit": True}))
    with pytest.raises(ValueError, match="fits the 'attention' model"):
        load_strategy(cfg)
    (tmp_path / "hdp.py").write_text("def build(s):\n    return s.distribute('HDP')\n")
    cfg = load_config(write_config(tmp_path, corpus, cost={"fit": True}, strategy="hdp.py"))
    with pytest.raises(ConfigError, match="cannot be combined with distribute"):
        load_strategy(cfg)


# -- the Planner with both models fitted (backbone and the image graph's encoder), no servers -------
ENC_A, ENC_B = 1e-4, 1e-4 / 16  # true encoder seconds per patch, per patch squared
IMAGE_GRAPH = "def build(s):\n    s.images().cost('patches').distribute('WORLD')\n    return s\n"


def _vision_planner(tmp_path, run: str, *, resume: bool):
    from flight_overlord.config import parse_config
    from flight_overlord.planner.planner import Planner
    (tmp_path / "f.parquet").write_bytes(b"")
    (tmp_path / "graph.py").write_text(IMAGE_GRAPH)
    cfg = parse_config({"seed": 1, "run_dir": str(tmp_path / run), "data_root": str(tmp_path), "strategy": "graph.py",
                        "sources": [{"name": "s", "paths": "f.parquet"}], "mesh": {"dp": 2},
                        "global_batch": {"context_length": 512, "microbatches": 2, "samples_per_step": 8},
                        "cost": {"a": 1.0, "b": 0.0, "fit": True, "fit_encoder": True, "lag": 1}}, base_dir=tmp_path)

    def meta(epoch, rg):
        sizes = [tuple(4 + (7 * r + 11 * i + rg.row_group) % 57 for i in range(1 + r % 2)) for r in range(rg.num_rows)]
        return {"num_tokens": np.array([30 + 17 * r for r in range(rg.num_rows)], dtype=np.int64),
                "image_patches": np.array([sum(s) for s in sizes], dtype=np.int64), "image_sizes": sizes}
    planner = Planner(cfg, load_strategy(cfg), lambda source: meta)
    planner.open(resume=resume)
    planner.roster.register_loader("s", 0, 0, "grpc://127.0.0.1:1", [["f.parquet", g, 9] for g in range(40)])
    planner.start_feeds()
    return planner


def _train(planner, last: int) -> None:
    """Plan up to step ``last`` - 1, each step's timings reported as soon as it is planned."""
    while planner.next_step < last:
        assert planner.feedback_ready(planner.next_step)
        plan = planner.plan_next()
        for bucket in range(2):
            mbs = [A * sum(p.tokens for p in b) + B * sum(p.tokens ** 2 for p in b) for b in plan.bucket_bins(bucket)]
            planner.report_compute(plan.step, bucket, mbs)
            images = [p.image_sizes[i] for p, i in plan.encoder[bucket]]
            seconds = ENC_A * sum(images) + ENC_B * sum(x * x for x in images)
            planner.report_compute(plan.step, bucket, seconds, "encoder")


def test_the_encoder_model_fits_too_and_a_resume_plans_as_an_undisturbed_run(tmp_path):
    straight = _vision_planner(tmp_path, "straight", resume=False)
    _train(straight, 30)
    status = straight.cost_status()
    assert status["encoder"]["b"] / status["encoder"]["a"] == pytest.approx(ENC_B / ENC_A, rel=0.2)
    assert status["b"] / status["a"] == pytest.approx(B / A, rel=0.2)
    straight.close()
    first = _vision_planner(tmp_path, "resumed", resume=False)
    _train(first, 12)  # the fits change at every step: the stop is between two models
    first.close()
    second = _vision_planner(tmp_path, "resumed", resume=True)
    restored, journaled = second.cost_status(), _fit_before(tmp_path / "straight", 12)
    assert second.next_step == 12 and (restored["a"], restored["b"], restored["since_step"]) == (
        journaled["a"], journaled["b"], journaled["step"])
    _train(second, 30)
    second.close()
    assert len(_plans(tmp_path / "straight")) == 30
    assert _plans(tmp_path / "resumed") == _plans(tmp_path / "straight")


def _plans(run_dir) -> list:
    """(step, digest of its plan: bins and encoder placement) of every journaled step."""
    from flight_overlord.journal import read_journal
    return [(r["step"], r["digest"]) for _, r in read_journal(run_dir / "plan-journal.jsonl") if "digest" in r]


def _fit_before(run_dir, step: int) -> dict:
    """The backbone's fit in force at ``step`` - 1, from a run's journal."""
    from flight_overlord.journal import read_journal
    fits = [r["cost_fit"] for _, r in read_journal(run_dir / "plan-journal.jsonl")
            if "cost_fit" in r and r["cost_fit"]["model"] == "backbone" and r["cost_fit"]["step"] < step]
    return fits[-1]
