"""The run's shape as a function of the step, like the mixture: the global batch (held, in steps, or a
linear ramp, as GPT-3 and Megatron's ``--rampup-batch-size`` grow it) and context-length stages (each
with its microbatch capacity, its microbatches per rank and, if it says so, its own mixture, as long-
context training extends the context in stages). Pure: the Planner and every replay of its journal
read the same shape at a step.

    batch_ramp(8, 32, start=0, end=40)        # 8 at step 0 to 32 at step 40, held after
    batch_steps([(0, 8), (100, 16)])          # 8 from step 0, 16 from step 100
    context_stage(20, 8192, microbatches=2, weights={"longdocs": 0.6, "code": 0.4})
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .schedules import Schedule


class BatchSchedule:
    """The global batch of a step, in the unit of the config's ``global_batch`` (samples or tokens)."""

    def at(self, step: int) -> int:
        raise NotImplementedError

    def describe(self) -> list:
        raise NotImplementedError


@dataclass(frozen=True)
class batch_ramp(BatchSchedule):
    """Linear from ``begin`` at step ``start`` to ``finish`` at step ``end`` (rounded), held outside."""
    begin: int
    finish: int
    start: int
    end: int

    def __post_init__(self):
        if self.begin < 1 or self.finish < 1:
            raise ValueError(f"batch ramp: sizes must be >= 1, got {self.begin} -> {self.finish}")
        if not 0 <= self.start < self.end:
            raise ValueError(f"batch ramp: need 0 <= start < end, got start {self.start}, end {self.end}")

    def at(self, step: int) -> int:
        t = min(1.0, max(0.0, (step - self.start) / (self.end - self.start)))
        return int(round(self.begin + (self.finish - self.begin) * t))

    def describe(self) -> list:
        return ["ramp", self.begin, self.finish, self.start, self.end]


@dataclass(frozen=True)
class batch_steps(BatchSchedule):
    """``[(first_step, size), ...]``: each size holds from its first step to the next one's."""
    stages: tuple

    def __init__(self, stages):
        stages = tuple(sorted((int(s), int(n)) for s, n in stages))
        if not stages or stages[0][0] != 0:
            raise ValueError("batch steps: the first must start at step 0")
        if any(n < 1 for _, n in stages) or len({s for s, _ in stages}) != len(stages):
            raise ValueError(f"batch steps: sizes must be >= 1, one per first step, got {list(stages)}")
        object.__setattr__(self, "stages", stages)

    def at(self, step: int) -> int:
        return [n for first, n in self.stages if first <= step][-1]

    def describe(self) -> list:
        return ["steps", [list(s) for s in self.stages]]


@dataclass(frozen=True)
class context_stage:
    """From ``first_step`` on: sequences of ``context_length`` tokens (a microbatch's capacity), packed
    into ``microbatches`` per rank, under ``weights`` if given (else the mixing schedule's)."""
    first_step: int
    context_length: int
    microbatches: int
    weights: Mapping[str, float] | None = None

    def __post_init__(self):
        if self.first_step < 0 or self.context_length < 1 or self.microbatches < 1:
            raise ValueError(f"context stage: need first_step >= 0, context_length >= 1 and microbatches >= 1, "
                             f"got {self.first_step}, {self.context_length}, {self.microbatches}")
        if self.weights is not None and (not self.weights or any(w < 0 for w in self.weights.values())
                                         or sum(self.weights.values()) <= 0):
            raise ValueError(f"context stage at step {self.first_step}: weights must be >= 0 with a positive "
                             f"sum, got {dict(self.weights)}")

    def describe(self) -> list:
        return [self.first_step, self.context_length, self.microbatches,
                None if self.weights is None else dict(sorted(self.weights.items()))]


def checked_stages(stages) -> tuple[context_stage, ...]:
    stages = tuple(sorted(stages, key=lambda s: s.first_step))
    if len({s.first_step for s in stages}) != len(stages):
        raise ValueError(f"context stages: two stages start at the same step ({[s.first_step for s in stages]})")
    return stages


def stage_at(stages: tuple[context_stage, ...], step: int) -> context_stage | None:
    """The stage ``step`` is in; None before the first (the config's ``global_batch`` holds)."""
    current = None
    for stage in stages:
        if stage.first_step <= step:
            current = stage
    return current


@dataclass(frozen=True)
class by_stage(Schedule):
    """The mixture of a step: its context stage's weights where the stage has some, else ``base``'s."""
    base: Schedule
    stages: tuple

    @property
    def lag(self) -> int:
        return self.base.lag

    def weights(self, step, feedback=None):
        stage = stage_at(self.stages, step)
        if stage is not None and stage.weights is not None:
            return dict(stage.weights)
        return self.base.weights(step, feedback)


@dataclass(frozen=True)
class RunShape:
    """The config's ``schedule`` section: a batch schedule (None: global_batch's size) and context stages."""
    batch: BatchSchedule | None = None
    context: tuple = ()
