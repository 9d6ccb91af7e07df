"""What the Planner's status and metrics count beside its plans: per-step plan statistics (the last
``STATS_KEPT`` steps), samples and tokens planned per source by this process, restarts of registered
roles, constructor plans per plans-stream answer, and what trainers reported waiting and their last loss. None of
it is journaled or read by planning.

No lock of its own: ``PlanService`` holds its lock around every call."""
from __future__ import annotations

from ..core.mixing import shares
from ..core.starvation import TrainerWaits
from .step_plan import StepPlan

STATS_KEPT = 1024   # per-step plan stats kept for the ``stats`` action (older steps: their journal records)


class PlanCounters:
    def __init__(self):
        self.stats: dict[int, dict] = {}
        self.planned = {"samples": {}, "tokens": {}}  # per source
        self.reregistrations = {"loader": 0, "constructor": 0}
        self.plan_answers: dict[str, int] = {}  # constructor plans per plans-stream answer -> answers
        self.trainer_waits = TrainerWaits()
        self.trainer_losses: dict[str, dict] = {}  # rank -> its last overall loss

    def step_planned(self, plan: StepPlan) -> None:
        self.stats[plan.step] = plan.stats
        self.stats.pop(plan.step - STATS_KEPT, None)  # bounded in steps (a rewind may leave a few)
        for key in ("samples", "tokens"):
            for source, n in plan.stats.get(key, {}).items():
                self.planned[key][source] = self.planned[key].get(source, 0) + n

    def answered(self, plans: int) -> None:
        self.plan_answers[str(plans)] = self.plan_answers.get(str(plans), 0) + 1

    def trainer_reported(self, rank: int, step: int, waits: dict | None, overall: float | None) -> None:
        if waits is not None:
            self.trainer_waits.add(rank, waits)
        if overall is not None:
            self.trainer_losses[str(rank)] = {"step": step, "loss": overall}

    def step_stats(self, first: int, last: int) -> dict:
        return {str(s): stats for s, stats in self.stats.items() if first <= s <= last}  # never walks the range

    def status(self, unit: str) -> dict:
        """``PlannerStatus``'s fields from these counts (``unit``: what the realized mixture is counted in)."""
        return {"samples_planned": dict(self.planned["samples"]), "tokens_planned": dict(self.planned["tokens"]),
                "mixture_realized": shares(self.planned[unit]), "reregistrations": dict(self.reregistrations),
                "plan_answers": dict(self.plan_answers),
                "trainer_waits": {str(r): w for r, w in self.trainer_waits.totals().items()},
                "trainer_losses": dict(self.trainer_losses)}
