"""Local search after construction: moves, swaps, re-splits and ejection chains out of the heaviest bin."""

from __future__ import annotations

import functools

import numpy as np

from .problem import _INF, _group, _Problem, lower_bound

# Refinement stops after this many improving steps per bin (plus a constant), or once it
# has evaluated this many candidate exchanges per item (plus a constant): a search stuck
# on tightly packed bins falls back to O(n) scans per step, and must not cost seconds.
_REFINE_STEPS_PER_BIN = 4
_REFINE_MIN_STEPS = 1000
_REFINE_WORK_PER_ITEM = 32
_REFINE_WORK_MIN = 2_000_000
# Partner bins tried per step: the lightest one, then the 32 lightest, then all of them.
_REFINE_WIDTHS = (1, 32)
# From the second width on, this many globally cheapest items are also tried as swap partners.
_REFINE_CHEAPEST = 4096
# Exact two-bin re-splits: tried with at most this many partner bins per step, and only
# when the two bins hold at most this many items together (2**items subsets).
_RESPLIT_BINS = 32
_RESPLIT_MAX_ITEMS = 14
# Ejection chains: how many overfilling first exchanges are tried per step.
_EJECT_TRIES = 16
# Refinement stops once the makespan is this close to the lower bound: far below step-time
# noise (a step's time varies by more than 0.1%), while the last 1e-3 of relative gap cost most
# of the search time: on the demo's 2 ranks x 4 microbatches a step planned in 18 ms at 1e-4, 5 ms at 1e-3.
_GOOD_ENOUGH = 1e-3
# Improvements smaller than this fraction of the makespan are float noise, not progress.
_REFINE_RTOL = 1e-9
# Re-splits and ejection chains cost far more per step, so they must gain at least this much.
_DEEP_RTOL = 1e-4


class _Refiner:
    """Local search on the heaviest bin h: move items out of it or swap them for lighter ones.

    A step is taken only if every touched bin ends below h's current cost, so the sorted
    load vector decreases lexicographically and the search terminates.  Per step, in
    order until one improves: single moves/swaps with the lightest bin; with the 32
    lightest bins (plus the globally cheapest items as swap partners); exact two-bin
    re-splits of h with small bins; two-link ejection chains (h overfills a bin, which
    then sheds load elsewhere); single moves/swaps with every bin.  Candidate partners
    come from one ``searchsorted`` on h's sorted costs, so singles cost O(m log m).
    """

    def __init__(self, problem: _Problem, bin_of: np.ndarray):
        self.p, self.bin_of = problem, bin_of
        self.loads, self.used, self.counts = problem.totals(bin_of)
        self.widths = [w for w in _REFINE_WIDTHS if w < problem.k] + [problem.k]
        self.budget = _REFINE_WORK_PER_ITEM * int(self.counts.sum()) + _REFINE_WORK_MIN

    @functools.cached_property
    def members(self) -> list[np.ndarray]:
        """Items per bin by ascending cost (built on first use: a good plan never needs it)."""
        return _group(self.p.desc[::-1], self.bin_of, self.p.k)

    @functools.cached_property
    def cheapest(self) -> np.ndarray:
        ascending = self.p.desc[::-1]
        return ascending[self.bin_of[ascending] >= 0][:_REFINE_CHEAPEST]

    def run(self) -> None:
        p = self.p
        placed_costs = p.costs[self.bin_of >= 0]
        bound = lower_bound(placed_costs, p.k, equal_size=p.quota is not None)
        good_enough = bound * (1 + _GOOD_ENOUGH)
        for _ in range(max(_REFINE_MIN_STEPS, _REFINE_STEPS_PER_BIN * p.k)):
            if self.loads.max() <= good_enough or self.budget <= 0 or not self._step():
                return

    def _step(self) -> bool:
        h = int(np.argmax(self.loads))
        target = self.loads[h] * (1 - _REFINE_RTOL)
        deep_target = self.loads[h] * (1 - _DEEP_RTOL)
        tiers = []
        for width in self.widths:
            tiers.append(self._candidates(h, width))
            if self._improve(h, *tiers[-1], target):
                return True
        return any(
            self._resplit(h, dests, deep_target) or self._eject(h, dests, partners, deep_target)
            for dests, partners in tiers
            if dests.size <= _RESPLIT_BINS
        )

    def _candidates(self, h, width):
        """The ``width`` lightest bins other than ``h``, and the items to swap with.

        Beyond the lightest bin, the globally cheapest items join the swap partners: a
        bin dominated by one huge item (common under ``equal_size``) can only improve by
        trading its small items for even smaller ones, wherever they are.
        """
        if width >= self.p.k:
            others = np.flatnonzero((self.bin_of >= 0) & (self.bin_of != h))
            return np.delete(np.arange(self.p.k), h), others
        if width == 1:
            lightest = np.array([np.argmin(self.loads)])
            lightest = lightest[lightest != h]  # all loads equal: nothing to gain
            return lightest, np.concatenate([self.members[d] for d in lightest] or [lightest])
        dests = np.argpartition(self.loads, width - 1)[:width]
        dests = dests[dests != h]
        elsewhere = np.ones(self.p.k, dtype=bool)
        elsewhere[dests] = elsewhere[h] = False
        cheap = self.cheapest[elsewhere[self.bin_of[self.cheapest]]]
        return dests, np.concatenate([cheap, *(self.members[d] for d in dests)])

    def _improve(self, h, dests, partners, target) -> bool:
        """Apply the single move or swap minimising max(new cost of h, new cost of its partner)."""
        items, partner, dest, delta = self._exchanges(h, dests, partners, reach=0.5)
        pair_max = np.maximum(self.loads[h] - delta, self.loads[dest] + delta)
        ok = (delta > 0) & (pair_max < target)
        if not ok.any():
            return False
        i = int(np.argmin(np.where(ok, pair_max, _INF)))
        self._apply(h, int(items[i]), int(partner[i]), int(dest[i]))
        return True

    def _eject(self, h, dests, partners, target) -> bool:
        """Exchange that relieves h but overfills a bin, followed by one that relieves that bin."""
        items, partner, dest, delta = self._exchanges(h, dests, partners, reach=1.0)
        overfill = self.loads[dest] + delta
        ok = (self.loads[h] - delta < target) & (overfill >= target)
        for i in np.flatnonzero(ok)[np.argsort(overfill[ok], kind="stable")][:_EJECT_TRIES]:
            first = (int(items[i]), int(partner[i]), int(dest[i]))
            self._apply(h, *first)
            if self._improve(first[2], *self._candidates(first[2], dests.size + 1), target):
                return True
            self._apply(first[2], first[0], first[1], h)  # undo: item back, partner back
        return False

    def _exchanges(self, h, dests, partners, reach):
        """Feasible candidate exchanges out of h as (item, partner or -1, dest, cost moved).

        Moves send each item of h to the lightest bin that can take it; swaps pair every
        partner b with the items of h whose cost is nearest ``cost(b) + reach * gap``
        (``reach=0.5`` balances the two bins, ``1.0`` just overfills the partner's bin).
        """
        moves = self._moves(h, dests)
        swaps = self._swaps(h, partners, reach)
        items, partner, dest, delta = (np.concatenate(pair) for pair in zip(moves, swaps))
        self.budget -= items.size
        ok = self._feasible(h, items, partner, dest)
        return items[ok], partner[ok], dest[ok], delta[ok]

    def _moves(self, h, dests):
        p, items = self.p, self.members[h]
        if p.quota is not None:  # a move must keep counts within one of each other
            dests = dests[self.counts[dests] < self.counts[h]]
        if dests.size == 0:
            items = items[:0]
            return items, items, items, p.costs[items]
        dests = dests[np.argsort(self.loads[dests], kind="stable")]
        slot = np.zeros(items.size, dtype=np.int64)
        if p.sizes is not None:  # lightest bin with room: first where the running max room suffices
            best_room = np.maximum.accumulate(p.capacity - self.used[dests])
            slot = np.minimum(np.searchsorted(best_room, p.sizes[items]), dests.size - 1)
        return items, np.full(items.size, -1), dests[slot], p.costs[items]

    def _swaps(self, h, partners, reach):
        own = self.members[h]
        ca, cb = self.p.costs[own], self.p.costs[partners]
        dest = self.bin_of[partners]
        idx = np.searchsorted(ca, cb + reach * (self.loads[h] - self.loads[dest]))
        below, above = idx > 0, idx < own.size  # nearest item of h on either side
        lo, hi = idx[below] - 1, idx[above]
        return (
            np.concatenate([own[lo], own[hi]]),
            np.concatenate([partners[below], partners[above]]),
            np.concatenate([dest[below], dest[above]]),
            np.concatenate([ca[lo] - cb[below], ca[hi] - cb[above]]),
        )

    def _feasible(self, h, items, partner, dest):
        """Capacity holds on both sides (``_moves`` already keeps the count rule)."""
        p = self.p
        if p.sizes is None:
            return np.ones(items.size, dtype=bool)
        moved = p.sizes[items] - np.where(partner >= 0, p.sizes[partner], 0.0)
        return (self.used[dest] + moved <= p.capacity) & (self.used[h] - moved <= p.capacity)

    def _resplit(self, h, dests, target) -> bool:
        """Exactly re-split ``h`` with one of ``dests`` (tried lightest first) if that lowers ``h``.

        Single moves and swaps get stuck when bins hold only a few coarse items; every
        exchange between two small bins is a subset of their union, so enumerate them all.
        """
        p = self.p
        for o in dests[np.argsort(self.loads[dests], kind="stable")]:
            union = np.concatenate([self.members[h], self.members[o]])
            if union.size > _RESPLIT_MAX_ITEMS:
                continue
            bits = _subset_bits(union.size)
            self.budget -= bits.size
            side = bits @ p.costs[union]
            pair_max = np.maximum(side, p.costs[union].sum() - side)
            ok = pair_max < target
            if p.quota is not None:  # the two counts may only trade places
                taken = bits.sum(axis=1)
                ok &= (taken == self.counts[h]) | (taken == self.counts[o])
            if p.sizes is not None:
                side_size = bits @ p.sizes[union]
                ok &= (side_size <= p.capacity) & (p.sizes[union].sum() - side_size <= p.capacity)
            if ok.any():
                keep = bits[int(np.argmin(np.where(ok, pair_max, _INF)))].astype(bool)
                for item in union[keep & (self.bin_of[union] == o)]:
                    self._relocate(item, o, h)
                for item in union[~keep & (self.bin_of[union] == h)]:
                    self._relocate(item, h, o)
                return True
        return False

    def _apply(self, src, item, partner, dest):
        self._relocate(item, src, dest)
        if partner >= 0:
            self._relocate(partner, dest, src)

    def _relocate(self, item, src, dst):
        p = self.p
        cost, size = p.costs[item], (p.sizes[item] if p.sizes is not None else 0.0)
        src_members = self.members[src]
        self.members[src] = src_members[src_members != item]
        dst_members = self.members[dst]
        at = int(np.searchsorted(p.costs[dst_members], cost))
        self.members[dst] = np.concatenate((dst_members[:at], [item], dst_members[at:]))
        self.bin_of[item] = dst
        self.loads[src] -= cost
        self.loads[dst] += cost
        self.used[src] -= size
        self.used[dst] += size
        self.counts[src] -= 1
        self.counts[dst] += 1


@functools.lru_cache(maxsize=None)
def _subset_bits(m: int) -> np.ndarray:
    """All 2**m subsets of m items as rows of 0/1 floats (row i = binary digits of i)."""
    return ((np.arange(2**m)[:, None] >> np.arange(m)) & 1).astype(np.float64)

