"""Mixing: which source the next sample comes from.

Smooth weighted round-robin over credits: every pick credits each source its weight
times the picked amount and charges the chosen one the amount. Deterministic, and the
realized mixture stays within one sample (or one sample's tokens) of the weights at
every point, not only on average; weights may change from step to step.
"""
from __future__ import annotations

import math
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

    def run(self, weights: Mapping[str, float]) -> "MixerRun":
        """``choose``/``charge`` for a whole step at Python-float speed (the planner's hot loop):
        the same arithmetic on the same doubles, so the same choices; ``close()`` writes back."""
        return MixerRun(self, self._weights(weights))

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

    def reset_credit(self) -> None:
        """A new mixture from here (a mixture edit): the old weights' credit would bend the first
        draws under the new ones; the realized amounts stay."""
        self._credit = np.zeros(len(self.sources))

    def state_dict(self) -> dict:
        return {"credit": self._credit.tolist(), "realized": self.realized.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self._credit = np.array(state["credit"], dtype=float)
        self.realized = np.array(state["realized"], dtype=float)


class MixerRun:
    """One step's draws on plain floats: ``choose()`` -> source index, ``charge(i, amount)``.

    numpy's per-call overhead on a handful of sources was most of the planner's mixing time;
    each operation here is the scalar of Mixer's vector one (credit + w, credit += w * amount,
    credit[i] -= amount), evaluated in the same order on IEEE doubles, so the credits, and
    with them every choice, are bit for bit those of ``choose``/``charge``."""

    def __init__(self, mixer: Mixer, w: np.ndarray):
        self._mixer = mixer
        self._w = w.tolist()
        self._credit = mixer._credit.tolist()
        self._realized = mixer.realized.tolist()
        self._eligible = [i for i, x in enumerate(self._w) if x > 0]

    def choose(self) -> int:
        credit, w = self._credit, self._w
        best, best_value = -1, -np.inf
        for i in self._eligible:  # ascending, strict >: ties go to the first source, as argmax
            value = credit[i] + w[i]
            if value > best_value:
                best, best_value = i, value
        return best

    def charge(self, i: int, amount: float) -> None:
        credit = self._credit
        for j, x in enumerate(self._w):
            credit[j] += x * amount
        credit[i] -= amount
        self._realized[i] += amount

    def fill(self, budget: float, take: list, *, by_tokens: bool, longest: float) -> list[int]:
        """``choose``, ``take[i]()`` (the chosen source's next sample's tokens, capped at ``longest``),
        ``charge`` (those tokens; or 1 when not ``by_tokens``, without calling ``take``) until
        ``budget`` is reached: the loop of a step's draw in one frame, the same operations as
        choose/charge. Returns the source chosen at each draw."""
        if not by_tokens and all(x >= 0 for x in self._w):
            return self._fill_count(max(0, int(math.ceil(budget))))
        credit, w, realized, eligible = self._credit, self._w, self._realized, self._eligible
        everyone = list(enumerate(w))
        choices, total, minus_inf = [], 0, -np.inf
        append = choices.append
        while total < budget:
            best, best_value = -1, minus_inf
            for i in eligible:  # ascending, strict >: ties go to the first source, as argmax
                value = credit[i] + w[i]
                if value > best_value:
                    best, best_value = i, value
            if by_tokens:
                tokens = take[best]()
                amount = tokens if tokens <= longest else longest
            else:
                amount = 1
            for j, x in everyone:
                credit[j] += x * amount
            credit[best] -= amount
            realized[best] += amount
            append(best)
            total += amount
        return choices

    def _fill_count(self, n: int) -> list[int]:
        """``fill`` charging 1 per draw, ``n`` draws. Charging 1 adds each source's weight to its
        credit (w * 1 == w), which is the value choose compares: one pass per draw does both."""
        credit, realized, choices = self._credit, self._realized, []
        positive = [(j, x) for j, x in enumerate(self._w) if x > 0]
        append, minus_inf = choices.append, -np.inf
        for _ in range(n):
            best, best_value = -1, minus_inf
            for j, x in positive:  # ascending, strict >: ties go to the first source, as argmax
                value = credit[j] + x
                credit[j] = value
                if value > best_value:
                    best, best_value = j, value
            credit[best] -= 1
            realized[best] += 1
            append(best)
        if n:  # the sources without weight were charged w * 1 = 0.0 each time: only -0.0 would change
            for j, x in enumerate(self._w):
                if not x > 0:
                    credit[j] += x
        return choices

    def close(self) -> None:
        self._mixer._credit = np.array(self._credit, dtype=float)
        self._mixer.realized = np.array(self._realized, dtype=float)
