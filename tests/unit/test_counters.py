"""``planner/counters.py``: what the Planner's status counts beside its plans."""
from __future__ import annotations

from flight_overlord.planner import counters
from flight_overlord.planner.counters import PlanCounters
from flight_overlord.planner.step_plan import StepPlan


def _plan(step: int, samples: dict, tokens: dict) -> StepPlan:
    return StepPlan(step, "DP", 1, 1, 8, [[]], {}, stats={"samples": samples, "tokens": tokens})


def test_planned_samples_and_tokens_add_up_and_stats_stay_bounded(monkeypatch):
    monkeypatch.setattr(counters, "STATS_KEPT", 3)
    count = PlanCounters()
    for step in range(5):
        count.step_planned(_plan(step, {"a": 2, "b": 1}, {"a": 20, "b": 30}))
    assert sorted(count.stats) == [2, 3, 4]
    assert count.step_stats(3, 10) == {"3": count.stats[3], "4": count.stats[4]}
    status = count.status("tokens")
    assert status["samples_planned"] == {"a": 10, "b": 5} and status["tokens_planned"] == {"a": 100, "b": 150}
    assert status["mixture_realized"] == {"a": 0.4, "b": 0.6}


def test_answers_reports_and_restarts_are_counted():
    count = PlanCounters()
    count.answered(2)
    count.answered(2)
    count.answered(1)
    count.reregistrations["loader"] += 1
    count.trainer_reported(3, 7, None, 1.5)
    count.trainer_reported(3, 8, None, None)  # timings only: the last loss stays
    status = count.status("samples")
    assert status["plan_answers"] == {"2": 2, "1": 1} and status["reregistrations"]["loader"] == 1
    assert status["trainer_losses"] == {"3": {"step": 7, "loss": 1.5}}
