"""The cost model fitted to the trainers' own timings (``cost: {model: attention, fit: true}``).

An observation is one microbatch (or a rank's whole step) a trainer timed: ``x1 = sum(l)`` and
``x2 = sum(l^2)`` over its samples' planned lengths, ``y`` its measured compute seconds. The model is
``y = a*x1 + b*x2`` with ``a, b >= 0`` (linear layers plus quadratic attention), fitted by least
squares with outliers rejected (a GC pause, a straggling host), and a prior from the config's
``a``, ``b``: pseudo-observations of the configured shape, scaled to the measured seconds, worth
``prior_weight`` real ones, so a few early reports cannot swing the model and many outweigh it.

Reproducible by construction: the fit used for step s reads only the reports of the steps in
``(s - lag - window, s - lag]`` (the Planner waits for step s - lag to be complete), in (step, bucket,
microbatch) order, so the same reports give the same fit whatever order they arrived in, and the state
is those reports only (plain numbers, bounded by ``window x buckets``, sampled down per step beyond
``max_per_step``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..stateful import Stateful

OUTLIER_MADS = 3.5     # a relative residual this many robust standard deviations out is rejected
MAD_TO_SIGMA = 1.4826  # MAD of a normal sample x this = its standard deviation


@dataclass(frozen=True)
class Fitted:
    """The model in force: ``a`` (seconds per token), ``b`` (per token squared) once fitted; the
    prior's own numbers (config units) before any report."""
    a: float
    b: float
    observations: int = 0  # reports the fit used (after outlier rejection)
    rejected: int = 0      # reports rejected as outliers
    through_step: int = -1  # the last step whose reports it read; -1: the prior alone

    @property
    def fitted(self) -> bool:
        return self.observations > 0

    def to_dict(self) -> dict:
        return {**asdict(self), "fitted": self.fitted}


class CostFit(Stateful):
    """Per-step timing reports and the fit they give for a step (pure: no I/O, no clock)."""

    def __init__(self, prior_a: float, prior_b: float, *, lag: int, window: int, buckets: int,
                 prior_weight: float = 4.0, max_per_step: int = 256):
        if prior_a <= 0 and prior_b <= 0:
            raise ValueError("cost fit: the prior (cost.a, cost.b) needs a positive coefficient")
        self.prior = Fitted(float(prior_a), float(prior_b))
        self.lag, self.window, self.buckets = lag, window, buckets
        self.prior_weight, self.max_per_step = prior_weight, max_per_step
        self.reports: dict[int, dict[int, list[list[float]]]] = {}  # step -> bucket -> [[x1, x2, seconds], ...]

    def add(self, step: int, bucket: int, rows: list[list[float]]) -> bool:
        """One bucket's timed rows of a step; the first report of a bucket wins (a retry is harmless)."""
        per_step = self.reports.setdefault(step, {})
        if bucket in per_step:
            return False
        per_step[bucket] = [[float(x1), float(x2), float(y)] for x1, x2, y in rows]
        return True

    def complete(self, step: int) -> bool:
        return len(self.reports.get(step, {})) >= self.buckets

    def missing(self, step: int) -> list[int]:
        """The buckets that have not reported ``step`` yet."""
        return sorted(set(range(self.buckets)) - set(self.reports.get(step, {})))

    def ready(self, step: int) -> bool:
        """Whether the fit of ``step`` can be decided: the reports of step - lag are all in."""
        return step < self.lag or self.complete(step - self.lag)

    def fit_for(self, step: int) -> Fitted:
        """The model step ``step`` is planned with (call once ``ready(step)``)."""
        last = step - self.lag
        if last < 0:
            return self.prior
        rows = [row for s in range(max(0, last - self.window + 1), last + 1)
                for _, per_bucket in sorted(self.reports.get(s, {}).items())
                for row in self._sampled(s, per_bucket)]
        if not rows:
            return self.prior
        data = np.asarray(rows, dtype=np.float64)
        a, b, kept = robust_fit(data[:, 0], data[:, 1], data[:, 2], self.prior, self.prior_weight)
        if a <= 0 and b <= 0:
            return self.prior
        return Fitted(a, b, int(kept.sum()), int((~kept).sum()), last)

    def _sampled(self, step: int, rows: list[list[float]]) -> list[list[float]]:
        """At most ``max_per_step / buckets`` rows of one bucket's report, evenly strided (deterministic)."""
        cap = max(1, self.max_per_step // self.buckets)
        return rows if len(rows) <= cap else [rows[i * len(rows) // cap] for i in range(cap)]

    def forget_before(self, next_step: int) -> None:
        """Drop what no step from ``next_step`` on reads."""
        oldest = next_step - self.lag - self.window + 1
        for s in [s for s in self.reports if s < oldest]:
            del self.reports[s]

    def state_dict(self) -> dict:
        return {"reports": {str(s): {str(b): rows for b, rows in per.items()} for s, per in self.reports.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Adds the state's reports to those held (the first report of a bucket wins): restoring a
        snapshot and then the journal's reports after it, in either order, gives the same state."""
        for step, per_bucket in state.get("reports", {}).items():
            for bucket, rows in per_bucket.items():
                self.add(int(step), int(bucket), rows)


def robust_fit(x1: np.ndarray, x2: np.ndarray, y: np.ndarray, prior: Fitted,
               prior_weight: float) -> tuple[float, float, np.ndarray]:
    """(a, b, kept) of ``y = a*x1 + b*x2``, a, b >= 0: least squares on relative errors (a long
    microbatch's noise is larger in seconds), a prior of the configured shape, and rounds of rejecting
    the rows whose relative residual is over ``OUTLIER_MADS`` robust deviations. The deviation is
    measured over every row, not the kept ones only, so rounds do not narrow it and eat the data."""
    kept = np.ones(len(y), dtype=bool)
    a, b = prior.a, prior.b
    for _ in range(4):
        a, b = _weighted_fit(x1[kept], x2[kept], y[kept], prior, prior_weight)
        predicted = a * x1 + b * x2
        relative = (y - predicted) / np.maximum(predicted, 1e-12)
        center = np.median(relative)
        spread = MAD_TO_SIGMA * np.median(np.abs(relative - center))
        if spread <= 0:
            break
        now = np.abs(relative - center) <= OUTLIER_MADS * spread
        if now.sum() < 2 or np.array_equal(now, kept):
            break
        kept = now
    return float(a), float(b), kept


def _weighted_fit(x1, x2, y, prior: Fitted, prior_weight: float) -> tuple[float, float]:
    shape = prior.a * x1 + prior.b * x2
    usable = shape > 0
    scale = float(np.median(y[usable] / shape[usable])) if usable.any() else 0.0
    # The prior: the same rows, timed as the configured model would (scaled to seconds), worth
    # prior_weight rows in all. Relative errors: each row weighed by 1 / its predicted seconds.
    prior_rows = prior_weight / max(len(y), 1)
    xs = np.concatenate([np.stack([x1, x2], axis=1)] * 2)
    ys = np.concatenate([y, scale * shape])
    weights = np.concatenate([np.ones(len(y)), np.full(len(y), prior_rows)])
    reference = np.maximum(np.concatenate([shape, shape]) * max(scale, 1e-300), 1e-300)
    root = np.sqrt(weights) / reference
    return _nonnegative_lstsq(xs * root[:, None], ys * root)


def _nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least squares in two unknowns, both >= 0: the free solution, else the better one-term fit."""
    norms = np.sqrt((x * x).sum(axis=0))
    norms[norms == 0] = 1.0
    solution = np.linalg.lstsq(x / norms, y, rcond=None)[0] / norms
    if (solution >= 0).all():
        return float(solution[0]), float(solution[1])
    best, best_loss = (0.0, 0.0), float(np.dot(y, y))
    for column in (0, 1):
        xc = x[:, column]
        denominator = float(np.dot(xc, xc))
        coefficient = max(0.0, float(np.dot(xc, y)) / denominator) if denominator > 0 else 0.0
        residual = y - coefficient * xc
        loss = float(np.dot(residual, residual))
        if loss < best_loss:
            best = (coefficient, 0.0) if column == 0 else (0.0, coefficient)
            best_loss = loss
    return best
