"""The operator's live edits of a running plan, journaled (fsync'd) before any plan reads them:
``overlord mix`` (weights from a future step on) and ``overlord skip`` (a window of future steps whose
samples are dropped). A part of ``Planner``, apart because planning does not need it."""
from __future__ import annotations

import logging

from .edits import mixed_weights

log = logging.getLogger(__name__)


class LiveEdits:
    """Mixed into ``Planner``: uses its ``_planning`` lock, ``next_step``, ``_journal``, ``overrides``,
    ``skips`` and ``strategy``."""

    def mix(self, weights: dict[str, float], at: int | None = None, *, only: bool = False,
            dry_run: bool = False) -> dict:
        """Live reweighting from step ``at`` (default: the first not planned yet), journaled (fsync'd) before
        any plan reads it. A source not in ``weights`` keeps its weight at that step (``only``: weighs 0).
        Answers the weights in force from that step on, and before it; ``dry_run`` journals nothing."""
        with self._planning:
            step = self.next_step if at is None else int(at)
            if step < self.next_step:
                raise ValueError(f"mix: step {step} is already planned (planned up to {self.next_step - 1}); "
                                 f"the earliest step a new mixture can start at is {self.next_step}")
            before = self._weights_in_force(step, need_fixed=not only)
            after = mixed_weights(weights, before or {}, self.strategy.sources, only=only)
            if not dry_run:
                self._journal.append({"mix": {"step": step, "weights": after}})
                self.overrides.add(step, after)
            return {"step": step, "weights": after, "before": before, "applied": not dry_run}

    def _weights_in_force(self, step: int, *, need_fixed: bool) -> dict[str, float] | None:
        """The weights step ``step`` would be planned with now: a live reweighting's, else the schedule's.
        None for a dynamic schedule (its weights wait for feedback), refused when ``need_fixed``."""
        override = self.overrides.weights_at(step)
        if override is not None:
            return override
        if self.strategy.schedule.lag:
            if need_fixed:
                raise ValueError("mix: this run's mixture follows trainer feedback (a dynamic schedule), so a source "
                                 "not named has no fixed weight to keep: name every source, or pass --only "
                                 "(sources not named weigh 0)")
            return None
        return {s: float(w) for s, w in self.strategy.schedule.weights(step).items()}

    def skip(self, first: int, last: int) -> dict:
        """Drop the samples steps ``first``..``last`` would have had (``core/skips.py``); journaled (fsync'd)
        before any plan reads it. Steps already planned cannot be skipped live."""
        with self._planning:
            if first < self.next_step:
                raise ValueError(f"skip: step {first} is already planned (up to {self.next_step - 1}): start at "
                                 f"{self.next_step} or later, or stop, add skip: [\"{first}:{last}\"] to the config, "
                                 f"resume")
            added = self._add_skip(first, last, "operator")
            return {"first": first, "last": last, "added": added, "windows": self.skips.state_dict()}

    def _add_skip(self, first: int, last: int, by: str) -> bool:
        if not self.skips.add(first, last, planned_to=self.next_step):
            return False
        self._journal.append({"skip": {"first": first, "last": last, "by": by, "planned_to": self.next_step}})
        log.info("steps %d-%d: their samples are dropped (skip set by the %s)", first, last, by)
        return True

