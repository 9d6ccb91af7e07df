"""The ``status`` answers of the roles, typed: what each role reports, written by the role and read
by ``metrics.py`` and ``deploy/status.py`` through the same class. On the wire each is the JSON
object of its fields (``to_wire``); ``from_wire`` takes such an object and fills a field missing
from it (an older or a down role's answer) with its default, so a reader never guesses keys.
"""
from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any


class _Status:
    def to_wire(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, raw: dict | None):
        raw = raw if isinstance(raw, dict) else {}
        known = {f.name for f in fields(cls)}
        missing = [f.name for f in fields(cls) if f.name not in raw
                   and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise ValueError(f"malformed {cls.__name__} answer: missing {', '.join(missing)}")
        return cls(**{k: v for k, v in raw.items() if k in known})


@dataclass(frozen=True)
class PlannerStatus(_Status):
    """Registration, planning progress, trainer positions, and where every role is."""
    ready: bool = False
    planned: int = -1                                     # the last planned step
    world_size: int = 0                                   # ranks of the run's mesh
    requested: dict[str, int] = field(default_factory=dict)  # rank -> the step it asked for last
    error: str | None = None
    recovered: bool = False
    samples_planned: dict[str, int] = field(default_factory=dict)
    tokens_planned: dict[str, int] = field(default_factory=dict)
    mixture_realized: dict[str, float] = field(default_factory=dict)
    reregistrations: dict[str, int] = field(default_factory=dict)
    loaders: list = field(default_factory=list)  # [source, actor, replica, location, row groups owned]
    constructors: dict[str, str] = field(default_factory=dict)  # index -> location
    scaling: dict | None = None                           # with loader.scaling: active actors, events
    metrics: str | None = None                            # the metrics page, if served
    cost: dict | None = None                              # the cost model in force (fitted with cost.fit)
    trainer_waits: dict[str, dict] = field(default_factory=dict)  # rank -> reported ticket/fetch/starved seconds
    trainer_losses: dict[str, dict] = field(default_factory=dict)  # rank -> {"step", "loss"}: its last overall loss
    mixture: dict = field(default_factory=dict)  # {"weights": in force, "pending": [{"step", "weights"}], "skips"}
    # plans in an answer -> plans-stream answers with so many
    plan_answers: dict[str, int] = field(default_factory=dict)

    def to_wire(self) -> dict:
        out = asdict(self)
        if self.scaling is None:
            del out["scaling"]
        return out


@dataclass(frozen=True)
class LoaderActorStatus(_Status):
    """One loader actor's buffer and read counters."""
    source: str
    actor: int
    row_groups_owned: Any = None
    segments: list = field(default_factory=list)
    buffered_row_groups: int = 0
    buffered_samples: int = 0
    buffered_bytes: int = 0
    bytes_served: int = 0
    demanded: Any = None
    released_below: Any = None
    failed_reads: int = 0
    recent_failed_reads: list = field(default_factory=list)


@dataclass(frozen=True)
class LoaderStatus:
    """A loader process: its first actor's fields at the top (as when a process hosted one actor),
    totals over its actors, and every actor under ``actors``."""
    actors: tuple[LoaderActorStatus, ...]
    metrics: str | None = None

    TOTALS = ("buffered_row_groups", "buffered_samples", "buffered_bytes", "bytes_served")

    def to_wire(self) -> dict:
        statuses = [a.to_wire() for a in self.actors]
        totals = {k: sum(s[k] for s in statuses) for k in self.TOTALS}
        return {**statuses[0], **totals, "actors": statuses, "metrics": self.metrics}

    @classmethod
    def from_wire(cls, raw: dict | None) -> "LoaderStatus":
        raw = raw if isinstance(raw, dict) else {}
        return cls(tuple(LoaderActorStatus.from_wire(a) for a in raw.get("actors", [])), raw.get("metrics"))


@dataclass(frozen=True)
class ConstructorStatus(_Status):
    """Assembly progress, staged steps, and what each rank was served."""
    index: int
    dp_ranks: list[int] = field(default_factory=list)
    assembled: int = -1                                   # the last assembled step
    staged_steps: list[int] = field(default_factory=list)
    error: str | None = None
    bad_samples: list[str] = field(default_factory=list)
    bytes_fetched: int = 0
    served: dict[str, dict] = field(default_factory=dict)  # rank -> {"step", "batches", "samples", "bytes"}
    metrics: str | None = None
    waits: dict[str, dict] = field(default_factory=dict)  # rank -> stage -> seconds waited (core/starvation.py)
