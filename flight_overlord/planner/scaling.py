"""The Planner's side of mixture-driven scaling (``loader.scaling``; the decisions and the ownership
are pure, in core/scaling.py).

Before planning a step, the step's weights go to the ``Scaler``; a decision becomes a new ownership
segment of the source, starting past everything its current actors may have read (so no buffered row
group changes hands), and is journaled with the step's plan (``"scaling"``) and in the planning state
after it (``"scaling"``: the scaler's counters, every source's segments, the latest events). The
metadata tickets of a resharded source carry its segments: its actors journal them, so their shadows
and restarts follow, and constructors find every sample at its owner (``Roster.owner``).
"""
from __future__ import annotations

from dataclasses import replace

from ..config import Config
from ..core.scaling import Ownership, Scaler
from .feed import SourceFeed
from .roster import Roster

KEEP_EVENTS = 32  # events kept in the journaled state and shown by status


class SourceScaling:
    def __init__(self, cfg: Config):
        rule = cfg.loader.scaling
        self.cfg = cfg
        self.scaler = Scaler({s.name: s.loaders for s in cfg.sources}, interval=rule.interval,
                             up_threshold=rule.up_threshold, down_threshold=rule.down_threshold,
                             consecutive=rule.consecutive,
                             max_actors={s.name: cfg.provisioned_actors(s) for s in cfg.sources})
        self.segments = {s.name: [[0, s.loaders]] for s in cfg.sources}
        self.events: list[dict] = []
        self._roster: Roster | None = None

    def start(self, roster: Roster) -> None:
        """Every loader registered: own the sources' row groups by segments from now on."""
        self._roster = roster
        roster.ownership = {name: Ownership(roster.source_row_groups(name), seed=self.cfg.seed, source=name,
                                              segments=segments) for name, segments in self.segments.items()}

    def decide(self, step: int, weights: dict[str, float], feeds: dict[str, SourceFeed]) -> list[dict]:
        """The scaling events taking effect at step ``step`` (before its plan asks for any metadata)."""
        events = []
        for event in self.scaler.observe(step, weights):
            ownership = self._roster.ownership[event.source]
            boundary = ownership.boundary(feeds[event.source].frontier(), self.cfg.loader.read_ahead_row_groups)
            ownership.extend(boundary, event.actors)
            self.segments[event.source] = ownership.to_list()
            events.append(replace(event, boundary=boundary).to_dict())
        self.events = (self.events + events)[-KEEP_EVENTS:]
        return events

    def segments_of(self, source: str) -> list[list[int]] | None:
        """What a metadata ticket carries: the source's segments once it was resharded."""
        segments = self.segments[source]
        return segments if len(segments) > 1 else None

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict(), "segments": self.segments, "events": self.events}

    def load_state_dict(self, state: dict) -> None:
        self.scaler.load_state_dict(state["scaler"])
        self.segments = {name: [list(s) for s in state["segments"].get(name, segments)]
                         for name, segments in self.segments.items()}
        self.events = list(state["events"])
        if self._roster is not None:
            self.start(self._roster)

    def status(self) -> dict:
        return {"actors": dict(self.scaler.actors), "segments": dict(self.segments), "events": list(self.events)}
