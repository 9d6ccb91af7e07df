"""Planning a step whose first draw is dropped (``core/skips.py``): the Planner and a replay of its
journal plan it the same way, so the dropped samples are re-derived, never journaled one by one."""
from __future__ import annotations

from .feed import SourceFeed
from .program import plan_step
from .step_plan import StepPlan


def plan_step_dropping(step: int, feeds: dict[str, SourceFeed], mixer, strategy, weights: dict, feedback,
                       *, drop_first: bool, cost_fn=None, encoder_cost_fn=None) -> StepPlan:
    """``plan_step``; with ``drop_first`` the step is planned twice from where the feeds are: the first
    plan's samples are dropped (``plan.dropped``, counted in ``stats["dropped"]``), the second is served.
    Samples the first plan deferred stay in the feeds' backlog, as any deferral: they were not placed."""
    dropped: list[tuple[str, int]] = []
    if drop_first:
        first = plan_step(step, feeds, mixer, strategy, weights, feedback, cost_fn=cost_fn,
                          encoder_cost_fn=encoder_cost_fn)
        dropped = [(pick.ref.key, pick.ref.epoch) for bin_ in first.bins for pick in bin_]
    plan = plan_step(step, feeds, mixer, strategy, weights, feedback, cost_fn=cost_fn, encoder_cost_fn=encoder_cost_fn)
    plan.dropped = dropped
    if drop_first:
        plan.stats["dropped"] = len(dropped)
    return plan
