"""Planning the first step of a skipped window (``core/skips.py``): the draws of every step of the
window are made and dropped, then the step is planned from the samples after them. The Planner and a
replay of its journal plan it the same way, so the dropped samples are re-derived, never journaled one
by one."""
from __future__ import annotations

from .feed import SourceFeed
from .program import plan_step
from .step_plan import StepPlan


def plan_step_dropping(step: int, feeds: dict[str, SourceFeed], mixer, strategy, weights: dict, feedback,
                       *, drop: tuple[int, int] | None, cost_fn=None, encoder_cost_fn=None) -> StepPlan:
    """``plan_step``; with ``drop`` = (first, last) the steps first..last are planned first, one after
    the other under ``weights`` (each with its own batch and context stage), as an undisturbed run would
    have planned them, and their samples dropped (``plan.dropped``; ``stats["dropped"]`` counts them,
    ``stats["dropped_steps"]`` names the steps); then ``step`` is planned from where that left the feeds.
    Samples those plans deferred stay in the feeds' backlog, as any deferral: they were not placed."""
    dropped: list[tuple[str, int]] = []
    for number in range(drop[0], drop[1] + 1) if drop else ():
        would_have = plan_step(number, feeds, mixer, strategy, weights, feedback, cost_fn=cost_fn,
                               encoder_cost_fn=encoder_cost_fn)
        dropped += [(pick.ref.key, pick.ref.epoch) for bin_ in would_have.bins for pick in bin_]
    plan = plan_step(step, feeds, mixer, strategy, weights, feedback, cost_fn=cost_fn, encoder_cost_fn=encoder_cost_fn)
    plan.dropped = dropped
    if drop:
        plan.stats.update(dropped=len(dropped), dropped_steps=list(drop))
    return plan
