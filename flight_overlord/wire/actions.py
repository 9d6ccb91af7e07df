"""The Planner's action bodies, typed like the tickets (``wire/tickets.py``): one frozen dataclass per
request with ``to_wire()`` (the JSON object a stock client sends) and ``from_wire(raw)`` (checked,
ValueError naming the field that is wrong), used by both ends.

- ``PlanRequest`` constructor -> Planner (action ``plan``, or a message on its plans stream): its share of a step,
  with its streams' positions; ``PositionsReport`` the same without a step, the positions alone
  (``plans_message`` tells them apart);
- ``ResumePointRequest`` constructor -> Planner (action ``resume_point``): where a (re)started one begins;
- ``Report`` trainer -> Planner (action ``report``): losses and/or measured seconds of one step;
- ``PositionRequest`` trainer -> Planner (action ``position``): where a rank that lost its state continues;
- ``StatsRequest`` anyone -> Planner (action ``stats``): per-step plan statistics of a step range;
- ``MixRequest`` operator -> Planner (action ``mix``): live reweighting from a future step on.
- ``SkipRequest`` operator -> Planner (action ``skip``): drop the samples a window of future steps would have had.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import field, optional_field


@dataclass(frozen=True)
class PlanRequest:
    step: int
    constructor: int
    positions: dict | None = None  # {rank: the next step its rank stream sends}; checked by the Planner
    # seconds the Planner may hold the request before answering "not yet" (a time-out): the constructor
    # then asks again with fresh positions (None: the Planner's own limit)
    wait: float | None = None

    def to_wire(self) -> dict:
        return {"step": self.step, "constructor": self.constructor,
                **({"positions": self.positions} if self.positions is not None else {}),
                **({"wait": self.wait} if self.wait is not None else {})}

    @classmethod
    def from_wire(cls, raw: dict) -> "PlanRequest":
        wait = raw.get("wait")
        if wait is not None and (isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait > 0):
            raise ValueError(f"malformed plan: field 'wait' must be a positive number of seconds, got {wait!r}")
        return cls(field(raw, "step", int, "plan"), field(raw, "constructor", int, "plan"),
                   optional_field(raw, "positions", dict, "plan"), wait)


@dataclass(frozen=True)
class PositionsReport:
    """A constructor's rank-stream positions, {rank: the next step it sends}, while it waits for its trainers."""
    constructor: int
    positions: dict

    def to_wire(self) -> dict:
        return {"constructor": self.constructor, "positions": self.positions}

    @classmethod
    def from_wire(cls, raw: dict) -> "PositionsReport":
        return cls(field(raw, "constructor", int, "positions report"),
                   field(raw, "positions", dict, "positions report"))


def plans_message(raw: dict) -> PlanRequest | PositionsReport:
    """A message of the plans stream, or the ``plan`` action's body: a plan request when it names a step."""
    return PlanRequest.from_wire(raw) if "step" in raw else PositionsReport.from_wire(raw)


@dataclass(frozen=True)
class ResumePointRequest:
    constructor: int

    def to_wire(self) -> dict:
        return {"constructor": self.constructor}

    @classmethod
    def from_wire(cls, raw: dict) -> "ResumePointRequest":
        return cls(field(raw, "constructor", int, "resume_point"))


@dataclass(frozen=True)
class Report:
    """A trainer's feedback on one step: per-source losses and/or its overall loss, its compute seconds
    (one number or one per microbatch), the vision encoder's seconds, and the data waits its client
    measured."""
    step: int
    rank: int
    losses: dict | None = None
    compute_seconds: float | list | None = None
    encoder_seconds: float | None = None
    waits: dict | None = None
    loss: float | None = None  # the rank's overall loss (status only: mixing needs per-source losses)

    def to_wire(self) -> dict:
        body = {"step": self.step, "rank": self.rank}
        for name in ("waits", "losses", "loss", "compute_seconds", "encoder_seconds"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        return body

    @classmethod
    def from_wire(cls, raw: dict) -> "Report":
        if not {"losses", "loss", "compute_seconds", "encoder_seconds"} & set(raw):
            raise ValueError("malformed report: give 'losses' ({source: loss}), 'loss' (overall), 'compute_seconds' "
                             "or 'encoder_seconds'")
        return cls(field(raw, "step", int, "report"), field(raw, "rank", int, "report"),
                   optional_field(raw, "losses", dict, "report"), raw.get("compute_seconds"),
                   raw.get("encoder_seconds"), optional_field(raw, "waits", dict, "report"),
                   raw.get("loss"))  # seconds: checked by the Planner's cost fit


@dataclass(frozen=True)
class PositionRequest:
    rank: int

    def to_wire(self) -> dict:
        return {"rank": self.rank}

    @classmethod
    def from_wire(cls, raw: dict) -> "PositionRequest":
        return cls(field(raw, "rank", int, "position"))


@dataclass(frozen=True)
class StatsRequest:
    first: int = 0
    last: int | None = None  # None: every planned step from ``first``

    def to_wire(self) -> dict:
        return {"from": self.first, **({"to": self.last} if self.last is not None else {})}

    @classmethod
    def from_wire(cls, raw: dict) -> "StatsRequest":
        return cls(field({"from": 0, **raw}, "from", int, "stats"), optional_field(raw, "to", int, "stats"))


@dataclass(frozen=True)
class SkipRequest:
    """Drop the samples steps ``first``..``last`` would have had (action ``skip``)."""
    first: int
    last: int

    def to_wire(self) -> dict:
        return {"first": self.first, "last": self.last}

    @classmethod
    def from_wire(cls, raw: dict) -> "SkipRequest":
        first, last = field(raw, "first", int, "skip"), field(raw, "last", int, "skip")
        from ..core.skips import checked_window
        return cls(*checked_window(first, last, where="skip"))


@dataclass(frozen=True)
class MixRequest:
    """Live reweighting (action ``mix``): new weights from ``step`` on (None: the first step not planned).
    Sources not named keep the weight they have at ``step``; with ``only`` they weigh 0. ``dry_run``: the
    answer says what would be in force, nothing is journaled."""
    weights: dict
    step: int | None = None
    only: bool = False
    dry_run: bool = False

    def to_wire(self) -> dict:
        return {"weights": self.weights, **({"step": self.step} if self.step is not None else {}),
                "only": self.only, "dry_run": self.dry_run}

    @classmethod
    def from_wire(cls, raw: dict) -> "MixRequest":
        return cls(field(raw, "weights", dict, "mix"), optional_field(raw, "step", int, "mix"),
                   optional_field(raw, "only", bool, "mix", False), optional_field(raw, "dry_run", bool, "mix", False))
