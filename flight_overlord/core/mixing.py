"""Mixing: which source the next sample comes from.

Smooth weighted round-robin over credits: every pick credits each source its weight
times the picked amount and charges the chosen one the amount. Deterministic, and the
realized mixture stays within one sample (or one sample's tokens) of the weights at
every point, not only on average; weights may change from step to step.

A step counted in samples draws all its samples at once (``MixerRun.fill``): each source's
count is its credit plus its share of the step, rounded (``apportion``), so the credits stay
within one sample of the weights at every step boundary, and the draws are spread evenly over
the step (``interleave``). At thousands of ranks a step is ~10^5 draws: a Python loop per draw
would cost more than balancing them.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ..stateful import Stateful


class Mixer(Stateful):
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

    numpy's per-call overhead would be most of the planner's mixing time on a handful of sources;
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
        if not by_tokens:
            return self._fill_count(max(0, int(math.ceil(budget)))).tolist()
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

    def _fill_count(self, n: int) -> np.ndarray:
        """``n`` draws charging 1 each, at once: every source's count is its quota (credit + n x weight)
        rounded so the counts sum to ``n`` (``apportion``), and the draws interleave the sources
        evenly (``interleave``). The credits end as quota - count, within one sample of the weights
        at every step boundary, as the one-draw-at-a-time loop keeps them; the order of the draws
        inside a step differs from that loop's (the balancer reorders a step's samples anyway)."""
        w = np.array(self._w)
        credit = np.array(self._credit)
        positive = w > 0
        quota = np.where(positive, credit + n * w, 0.0)
        counts = apportion(quota, positive, n)
        self._credit = np.where(positive, quota - counts, credit).tolist()
        self._realized = (np.array(self._realized) + counts).tolist()
        return interleave(counts)

    def close(self) -> None:
        self._mixer._credit = np.array(self._credit, dtype=float)
        self._mixer.realized = np.array(self._realized, dtype=float)


def apportion(quota: np.ndarray, eligible: np.ndarray, n: int) -> np.ndarray:
    """Non-negative integer counts summing to ``n``, zero where not ``eligible``, each within one of
    its ``quota`` where the quotas allow it: the floors, then one more for the largest remainders
    (or one less for the smallest) until the sum is ``n``; ties go to the lower index."""
    counts = np.where(eligible, np.maximum(np.floor(quota), 0), 0).astype(np.int64)
    index = np.arange(quota.size)
    while (short := n - int(counts.sum())) != 0:
        room = quota - counts
        if short > 0:
            candidates = np.flatnonzero(eligible)
            order = candidates[np.lexsort((index[candidates], -room[candidates]))]
        else:
            candidates = np.flatnonzero(eligible & (counts > 0))
            order = candidates[np.lexsort((index[candidates], room[candidates]))]
        if not candidates.size:
            raise ValueError("mixture weights must have a positive sum")
        counts[order[:abs(short)]] += 1 if short > 0 else -1
    return counts


def interleave(counts: np.ndarray) -> np.ndarray:
    """The source of each draw when source j gives ``counts[j]`` of them, spread evenly: its m-th
    draw sits at (m + 1/2) / counts[j] of the step, ties in source order."""
    sources = np.repeat(np.arange(counts.size), counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    at = (np.arange(sources.size) - starts + 0.5) / np.repeat(np.maximum(counts, 1), counts)
    return sources[np.argsort(at, kind="stable")]  # stable: equal times keep the source order


def shares(counts: dict[str, int]) -> dict[str, float]:
    """Each source's share of ``counts`` (what was planned, in the unit the mixer weighs: tokens or samples)."""
    total = sum(counts.values())
    return {source: n / total for source, n in counts.items()} if total else {}
