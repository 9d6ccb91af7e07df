"""Mixing schedules: the weight of every source at each step.

A schedule is a pure function of the step, and, for dynamic mixing, of trainer feedback read
with a fixed lag: the weights of step s only ever depend on feedback of step s - lag, which the
Planner waits for and journals, so a plan is reproducible whatever the timing.

    constant({"web": 0.7, "code": 0.3})
    staged([(0, {"web": 1.0}), (1000, {"web": 0.5, "code": 0.5})])
    linear({"short": 1.0}, {"short": 0.5, "long": 0.5}, start=0, end=5000)   # also cosine(...)
    lambda step: {...}                                                       # any callable
    dynamic(loss_weighted({"web": 0.5, "code": 0.5}, temperature=1.0), lag=4)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

Weights = dict[str, float]
Losses = dict[str, float]  # per-source mean loss reported by trainers for one step


class Schedule:
    lag = 0  # feedback steps this schedule reads back; 0: it reads none

    def weights(self, step: int, feedback: Losses | None = None) -> Weights:
        raise NotImplementedError


@dataclass(frozen=True)
class constant(Schedule):
    mixture: Mapping[str, float]

    def weights(self, step, feedback=None):
        return dict(self.mixture)


@dataclass(frozen=True)
class staged(Schedule):
    """``[(first_step, weights), ...]``: each mixture holds from its first step to the next one's."""
    stages: tuple

    def __init__(self, stages):
        stages = tuple(sorted(((int(s), dict(w)) for s, w in stages), key=lambda x: x[0]))
        if not stages or stages[0][0] != 0:
            raise ValueError("staged schedule: the first stage must start at step 0")
        object.__setattr__(self, "stages", stages)

    def weights(self, step, feedback=None):
        current = self.stages[0][1]
        for first, mixture in self.stages:
            if step >= first:
                current = mixture
        return dict(current)


@dataclass(frozen=True)
class linear(Schedule):
    """From ``begin`` to ``finish`` weights between steps ``start`` and ``end`` (held outside)."""
    begin: Mapping[str, float]
    finish: Mapping[str, float]
    start: int
    end: int

    def __post_init__(self):
        if self.end <= self.start:
            raise ValueError(f"{type(self).__name__} schedule: end ({self.end}) must be after start ({self.start})")

    def progress(self, step: int) -> float:
        return min(1.0, max(0.0, (step - self.start) / (self.end - self.start)))

    def weights(self, step, feedback=None):
        t = self.progress(step)
        return interpolate(self.begin, self.finish, t)


class cosine(linear):
    """Like ``linear`` but eased: slow at both ends (half a cosine period)."""

    def progress(self, step: int) -> float:
        return 0.5 - 0.5 * math.cos(math.pi * super().progress(step))


@dataclass(frozen=True)
class from_callable(Schedule):
    fn: Callable[[int], Mapping[str, float]]

    def weights(self, step, feedback=None):
        return dict(self.fn(step))


@dataclass(frozen=True)
class dynamic(Schedule):
    """Weights from trainer feedback: ``rule(step, losses of step - lag) -> weights``.

    Before step ``lag`` there is no feedback yet and ``rule`` gets ``None``."""
    rule: Callable[[int, Losses | None], Mapping[str, float]]
    lag: int = 4

    def __post_init__(self):
        if self.lag < 1:
            raise ValueError("dynamic schedule: lag must be >= 1 (a plan cannot read its own step's loss)")

    def weights(self, step, feedback=None):
        return dict(self.rule(step, feedback))


@dataclass(frozen=True)
class loss_weighted:
    """A dynamic rule: ``base`` weights scaled by exp(loss / temperature), so sources the model
    finds hard get more samples (a simple online DoReMi-style rule). Sources nobody reported
    keep their base weight."""
    base: Mapping[str, float]
    temperature: float = 1.0

    def __call__(self, step: int, losses: Losses | None) -> Weights:
        if not losses:
            return dict(self.base)
        mean = sum(losses.values()) / len(losses)
        return {s: w * math.exp((losses.get(s, mean) - mean) / self.temperature) for s, w in self.base.items()}


def interpolate(a: Mapping[str, float], b: Mapping[str, float], t: float) -> Weights:
    return {s: (1 - t) * a.get(s, 0.0) + t * b.get(s, 0.0) for s in sorted(set(a) | set(b))}


def as_schedule(value) -> Schedule:
    """What ``mix()`` accepts: a schedule, a mapping of constant weights, or a callable of the step."""
    if isinstance(value, Schedule):
        return value
    if isinstance(value, Mapping):
        return constant(dict(value))
    if callable(value):
        return from_callable(value)
    raise TypeError(f"mix(): expected a schedule, a mapping of weights or a callable of the step, got {value!r}")


@dataclass
class FeedbackLog:
    """Per-step trainer reports, aggregated the same way whatever order they arrived in."""
    expected: int  # reports (distinct data-parallel groups) that make a step's feedback complete
    reports: dict[int, dict[int, Losses]] = field(default_factory=dict)  # step -> group -> losses
    floor: int = 0  # reports of steps below this are no longer needed (forget_before) and not kept

    def add(self, step: int, group: int, losses: Losses) -> bool:
        """Record one report; the first report of a group for a step wins (retries are harmless)."""
        if step < self.floor:
            return False
        per_step = self.reports.setdefault(step, {})
        if group in per_step:
            return False
        per_step[group] = {str(k): float(v) for k, v in losses.items()}
        return True

    def forget_before(self, step: int) -> None:
        """Drop the reports of steps below ``step`` (no plan reads them any more): bounded in steps."""
        if step > self.floor:
            self.floor = step
            for old in [s for s in self.reports if s < step]:
                del self.reports[old]

    def complete(self, step: int) -> bool:
        return len(self.reports.get(step, {})) >= self.expected

    def losses(self, step: int) -> Losses:
        """Mean per source over the groups that reported it, in group order (deterministic)."""
        sums: dict[str, list[float]] = {}
        for _, losses in sorted(self.reports.get(step, {}).items()):
            for source, loss in losses.items():
                sums.setdefault(source, []).append(loss)
        return {s: math.fsum(v) / len(v) for s, v in sorted(sums.items())}


def weights_at(schedule: Schedule, step: int, feedback: FeedbackLog | None) -> tuple[Weights, Losses | None]:
    """The weights of ``step`` and the feedback they were computed from (None when not read)."""
    if schedule.lag and step >= schedule.lag and feedback is not None:
        losses = feedback.losses(step - schedule.lag)
        return schedule.weights(step, losses), losses
    return schedule.weights(step, None), None
