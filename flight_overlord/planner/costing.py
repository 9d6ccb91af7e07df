"""The Planner's fitted cost model (``cost: {fit: true}``): timing reports in, the model of each step out.

A trainer reports the compute seconds of a step (one float, or one per microbatch); the Planner turns
them into rows ``[sum(l), sum(l^2), seconds]`` from the step's plan (the planned length of every
sample of the rank's bucket), journals the rows as a ``compute`` record (they are the run's input:
measured, not derivable), and fits ``a``, ``b`` (``core/costfit.py``). Step s is planned with the fit
of the reports of steps <= s - lag, decided when s is planned and journaled as a ``cost_fit`` record
whenever it changes, so plans replay exactly and ``overlord status`` shows the model in force.

Two models may be fitted: ``backbone`` (the attention model of the sequences: a rank's bucket, one
row per microbatch) and, with ``cost.fit_encoder`` and an image graph, ``encoder`` (the patches model
of the images a rank's vision encoder processes: one row per step, ``sum(p)``, ``sum(p^2)``).
"""
from __future__ import annotations

import math
from typing import Callable

from ..core.cost import CostFn, attention_cost, patches_cost
from ..core.costfit import CostFit, Fitted
from .program import StepPlan

SHAPES_KEPT = 64  # steps whose microbatch sums stay in memory; older reports read their plan from the journal
# a fitted model's name (in ``cost_fit`` records and a step's journaled inputs) -> its cost function of (a, b)
FITTED_COST_FNS: dict[str, Callable[[float, float], CostFn]] = {"backbone": attention_cost, "encoder": patches_cost}


def cost_fns(params: dict[str, list[float]]) -> dict[str, CostFn]:
    """The cost functions of the models in force, from their journaled ``{name: [a, b]}``."""
    return {name: FITTED_COST_FNS[name](*ab) for name, ab in params.items()}


class PlannedCost:
    """One fitted model: ``name`` in its records (``FITTED_COST_FNS`` gives the cost function the Planner
    plans with), ``shapes_of(plan)`` the per-bucket rows its reports are read against."""

    def __init__(self, name: str, prior_a: float, prior_b: float, *, lag: int, window: int, buckets: int,
                 shapes_of: Callable[[StepPlan], list]):
        self.name, self.shapes_of, self.make_cost = name, shapes_of, FITTED_COST_FNS[name]
        self.fit = CostFit(prior_a, prior_b, lag=lag, window=window, buckets=buckets)
        self.in_force: Fitted = self.fit.prior
        self.in_force_from = 0  # the first step planned with ``in_force``
        self._shapes: dict[int, list[list[list[float]]]] = {}  # step -> bucket -> [[sum l, sum l^2] per microbatch]

    # -- planning ----------------------------------------------------------------------
    def ready(self, step: int) -> bool:
        return self.fit.ready(step)

    def decide(self, step: int) -> tuple[CostFn, dict | None]:
        """The cost function of ``step`` and, when the model changes there, the journal record saying so."""
        fitted = self.fit.fit_for(step)
        record = None
        if fitted != self.in_force or step == 0:
            self.in_force, self.in_force_from = fitted, step
            record = {"cost_fit": {"model": self.name, "step": step, **fitted.to_dict()}}
        self.fit.forget_before(step + 1)
        return self.make_cost(fitted.a, fitted.b), record

    def planned(self, plan: StepPlan) -> None:
        """Keep the step's microbatch sums, which its timing reports are read against."""
        self._shapes[plan.step] = self.shapes_of(plan)
        for old in [s for s in self._shapes if s <= plan.step - SHAPES_KEPT]:
            del self._shapes[old]

    def restore(self, record: dict) -> None:
        """A journaled ``cost_fit`` record (resume): the model in force from its step."""
        fields = dict(record)
        self.in_force_from = fields.pop("step")
        fields.pop("fitted", None)
        fields.pop("model", None)
        self.in_force = Fitted(**fields)

    # -- reports -----------------------------------------------------------------------
    def rows(self, step: int, bucket: int, seconds, plan: StepPlan | None = None) -> list[list[float]]:
        """A report's rows; ``plan``: the step's plan when its sums are no longer in memory."""
        per_bucket = self._shapes.get(step) or (self.shapes_of(plan) if plan is not None else None)
        if per_bucket is None:
            raise KeyError(f"report: the plan of step {step} is in no journal of this run")
        sums = per_bucket[bucket]
        values = checked_seconds(seconds, len(sums))
        if len(values) == 1 and len(sums) > 1:  # one float for the whole step: one row of the bucket's sums
            return [[math.fsum(s[0] for s in sums), math.fsum(s[1] for s in sums), values[0]]]
        return [[x1, x2, y] for (x1, x2), y in zip(sums, values)]

    def add(self, step: int, bucket: int, rows: list[list[float]]) -> bool:
        return self.fit.add(step, bucket, rows)

    def knows_shapes(self, step: int) -> bool:
        return step in self._shapes

    # -- state -------------------------------------------------------------------------
    def status(self, next_step: int) -> dict:
        waiting = next_step - self.fit.lag
        return {"model": "attention" if self.name == "backbone" else "patches", **self.in_force.to_dict(),
                "since_step": self.in_force_from,
                "prior": {"a": self.fit.prior.a, "b": self.fit.prior.b}, "lag": self.fit.lag,
                "window": self.fit.window,
                "waiting_for": ({"step": waiting, "buckets": self.fit.missing(waiting)}
                                if waiting >= 0 and not self.fit.complete(waiting) else None)}

    def state_dict(self) -> dict:
        return self.fit.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.fit.load_state_dict(state)


def backbone(cfg, strategy, lag: int, window: int) -> PlannedCost:
    params = strategy.cost_params
    return PlannedCost("backbone", params["a"], params["b"], lag=lag, window=window, buckets=strategy.num_buckets,
                       shapes_of=sequence_shapes)


def encoder(cfg, strategy, lag: int, window: int) -> PlannedCost:
    graph = strategy.image_graph
    return PlannedCost("encoder", graph.cost_params["a"], graph.cost_params["b"], lag=lag, window=window,
                       buckets=strategy.mesh.num_buckets(graph.axis), shapes_of=image_shapes)


def sequence_shapes(plan: StepPlan) -> list[list[list[float]]]:
    """Per bucket, per microbatch: [sum of the planned lengths, sum of their squares]."""
    return [[[float(sum(p.tokens for p in bin_)), float(sum(p.tokens * p.tokens for p in bin_))]
             for bin_ in plan.bucket_bins(bucket)] for bucket in range(plan.num_buckets)]


def image_shapes(plan: StepPlan) -> list[list[list[float]]]:
    """Per encoder bucket, one row: [sum of its images' patches, sum of their squares]."""
    patches = [[float(p.image_sizes[i]) for p, i in images] for images in plan.encoder or []]
    return [[[math.fsum(x), math.fsum(v * v for v in x)]] for x in patches]


def checked_seconds(seconds, microbatches: int) -> list[float]:
    """A report's ``compute_seconds``: a number, or a list of one per microbatch; finite and >= 0."""
    values = seconds if isinstance(seconds, list) else [seconds]
    if isinstance(seconds, list) and len(values) not in (1, microbatches):
        raise ValueError(f"report: compute_seconds lists {len(values)} microbatches; the rank's step has "
                         f"{microbatches} (or give one number for the whole step)")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"report: compute_seconds must be finite numbers >= 0, got {value!r}")
    return [float(v) for v in values]
