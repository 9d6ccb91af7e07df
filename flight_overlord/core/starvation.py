"""Starvation attribution: why a rank waited for its data, stage by stage (pure: the caller gives times).

A Data Constructor works on one step after another: it asks the Planner for the step's plan (stage
``plan``), fetches the samples from the loaders concurrently, then assembles. Of the fetch, only the
call that finished last held the step up; its time is split into what the loaders reported spending
on each source (``loader:SOURCE``) and the rest (``loader network``: transfer and queueing). The
constructor records these as intervals; when a rank's ``do_get`` waits for a step that is not
assembled yet, every moment of the wait is charged to the stage the constructor was in at that
moment (``other`` when none). The trainer side adds ``ticket`` (its Planner call) and ``transfer``
(its fetch time beyond the constructor-side wait) when it reports them.

:func:`summarize` names, per rank, the stage (and source) that starved it most, and groups the ranks
by that cause; ``overlord status`` prints it.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

OTHER = "other"
LOADER = "loader:"  # + source name


@dataclass(frozen=True)
class Interval:
    start: float
    end: float
    shares: dict[str, float]  # stage -> weight: the interval's time is split in these proportions


class StageTimeline:
    """The stage intervals of the recent steps and each rank's attributed waits (last ``keep`` waits)."""

    def __init__(self, keep: int = 64):
        self.keep = keep
        self._intervals: deque[Interval] = deque(maxlen=8 * keep)
        self._waits: dict[int, deque[dict[str, float]]] = {}

    def stage(self, start: float, end: float, name: str | None = None, shares: dict[str, float] | None = None) -> None:
        """One stage (``name``) or a mix of stages (``shares``, weights) from ``start`` to ``end``."""
        if end > start:
            self._intervals.append(Interval(start, end, shares if shares else {name or OTHER: 1.0}))

    def waited(self, rank: int, start: float, end: float) -> dict[str, float]:
        """Charge a wait of ``rank`` to the stages it overlapped; returns the seconds per stage."""
        charged: dict[str, float] = {}
        covered = 0.0
        for interval in self._intervals:
            overlap = min(end, interval.end) - max(start, interval.start)
            if overlap <= 0:
                continue
            covered += overlap
            total = sum(interval.shares.values()) or 1.0
            for stage, weight in interval.shares.items():
                charged[stage] = charged.get(stage, 0.0) + overlap * weight / total
        if end - start > covered:
            charged[OTHER] = charged.get(OTHER, 0.0) + (end - start - covered)
        self._waits.setdefault(rank, deque(maxlen=self.keep)).append(charged)
        return charged

    def totals(self) -> dict[int, dict[str, float]]:
        """Per rank, seconds waited per stage over its last ``keep`` waits."""
        out = {}
        for rank, waits in self._waits.items():
            stages: dict[str, float] = {}
            for charged in waits:
                for stage, seconds in charged.items():
                    stages[stage] = stages.get(stage, 0.0) + seconds
            out[rank] = stages
        return out


TRAINER_WAITS = ("ticket", "fetch", "starved")  # a trainer's seconds per step: Planner call, data call, loop idle


class TrainerWaits:
    """The waits trainers reported with their steps (``report(..., waits)``), the last ``keep`` per rank."""

    def __init__(self, keep: int = 64):
        self.keep = keep
        self._waits: dict[int, deque[dict[str, float]]] = {}

    def add(self, rank: int, waits: dict) -> None:
        unknown = sorted(set(waits) - set(TRAINER_WAITS))
        if unknown:
            raise ValueError(f"report: unknown wait {unknown[0]!r} (waits: {', '.join(TRAINER_WAITS)})")
        for name, value in waits.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"report: wait {name!r} must be a finite number of seconds >= 0, got {value!r}")
        self._waits.setdefault(rank, deque(maxlen=self.keep)).append({k: float(v) for k, v in waits.items()})

    def totals(self) -> dict[int, dict[str, float]]:
        return {rank: {name: sum(w.get(name, 0.0) for w in waits) for name in TRAINER_WAITS} | {"steps": len(waits)}
                for rank, waits in sorted(self._waits.items())}


def with_trainer_side(constructor: dict[str, float], trainer: dict[str, float] | None) -> dict[str, float]:
    """A rank's stages: the constructor-side ones, plus ``ticket`` and ``transfer`` (its data calls'
    time beyond the ticket and what the constructor saw it wait) when the trainer reported its waits."""
    stages = dict(constructor)
    if trainer:
        ticket = trainer.get("ticket", 0.0)
        stages["ticket"] = ticket
        stages["transfer"] = max(0.0, trainer.get("fetch", 0.0) - ticket - sum(constructor.values()))
    return stages


def fetch_shares(call_seconds: float, served: dict[str, float]) -> dict[str, float]:
    """A loader call's time split: what the loader spent per source, the rest network/queueing."""
    shares = {LOADER + source: max(0.0, seconds) for source, seconds in served.items()}
    shares["loader network"] = max(0.0, call_seconds - sum(shares.values()))
    return shares


def summarize(ranks: dict[int, dict[str, float]], min_seconds: float = 0.05) -> dict:
    """Per rank: its waits by stage, total and main cause; and the causes with the ranks they starve.

    ``ranks``: rank -> stage -> seconds. A rank that waited less than ``min_seconds`` has no cause."""
    per_rank, causes = {}, {}
    for rank, stages in sorted(ranks.items()):
        total = sum(stages.values())
        entry = {"waited": total, "stages": dict(sorted(stages.items(), key=lambda kv: -kv[1])), "cause": None}
        if total >= min_seconds and stages:
            stage, seconds = max(stages.items(), key=lambda kv: (kv[1], kv[0]))
            entry["cause"] = describe(stage) | {"share": seconds / total}
            group = causes.setdefault(stage, {**describe(stage), "ranks": [], "seconds": 0.0})
            group["ranks"].append(rank)
            group["seconds"] += seconds
        per_rank[str(rank)] = entry
    return {"ranks": per_rank, "causes": sorted(causes.values(), key=lambda c: -c["seconds"])}


def describe(stage: str) -> dict:
    """``loader:qa`` -> {"stage": "loader fetch", "source": "qa"}; others name the stage only."""
    if stage.startswith(LOADER):
        return {"stage": "loader fetch", "source": stage[len(LOADER):]}
    return {"stage": stage, "source": None}
