"""Mixing: which source the next sample comes from.

Smooth weighted round-robin over credits: every pick credits each source its weight
times the picked amount and charges the chosen one the amount. Deterministic, and the
realized mixture stays within one sample (or one sample's tokens) of the weights at
every point, not only on average; weights may change from step to step.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np


class Mixer:
    def __init__(self, sources: list[str]):
        self.sources = list(sources)
        self._credit = np.zeros(len(sources))
        self.realized = np.zeros(len(sources))  # amount charged so far per source
        self._cached_key: tuple | None = None
        self._cached_mapping: Mapping[str, float] | None = None
        self._cached = np.zeros(len(sources))

    def choose(self, weights: Mapping[str, float]) -> str:
        w = self._weights(weights)
        eligible = np.where(w > 0, self._credit + w, -np.inf)
        return self.sources[int(np.argmax(eligible))]  # ties -> first source

    def charge(self, source: str, amount: float, weights: Mapping[str, float]) -> None:
        self._apply(source, amount, self._weights(weights))

    def refund(self, source: str, amount: float, weights: Mapping[str, float]) -> None:
        """Undo a charge exactly (a planned sample was deferred to a later step)."""
        self._apply(source, -amount, self._weights(weights))

    def _apply(self, source: str, amount: float, w: np.ndarray) -> None:
        i = self.sources.index(source)
        self._credit += w * amount
        self._credit[i] -= amount
        self.realized[i] += amount

    def _weights(self, weights: Mapping[str, float]) -> np.ndarray:
        # Called twice per sample with the same step weights: normalise once per distinct mixture,
        # and recognise the step's own mapping without even reading it (plans never mutate it).
        if weights is self._cached_mapping:
            return self._cached
        self._cached_mapping = weights
        key = tuple(float(weights.get(s, 0.0)) for s in self.sources)
        if key != self._cached_key:
            w = np.array(key)
            if w.sum() <= 0:
                raise ValueError("mixture weights must have a positive sum")
            self._cached_key, self._cached = key, w / w.sum()
        return self._cached

    def state_dict(self) -> dict:
        return {"credit": self._credit.tolist(), "realized": self.realized.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self._credit = np.array(state["credit"], dtype=float)
        self.realized = np.array(state["realized"], dtype=float)
