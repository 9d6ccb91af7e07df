"""Makespan balancing: place weighted items into k bins so the heaviest bin is as light as possible.

A training step waits for its slowest data-parallel rank (and a rank for its slowest
microbatch), so samples with a compute cost are spread over k bins to minimise the
heaviest bin's total cost.  Pure numpy, no I/O: callers from other frameworks can use it
on plain lists of costs.

Constructions: ``greedy`` (LPT) and ``karmarkar_karp`` (multiway largest differencing).
Both are followed by a local search (``refine``) that moves or swaps items out of the
heaviest bin, which closes most of the gap LPT/LDM leave on skewed cost distributions
(and under ``equal_size``, where balanced differencing alone can be several % off).
Optional ``sizes``/``capacity`` (e.g. tokens per microbatch) are a hard limit per bin.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import numbers
import sys
from dataclasses import dataclass

import numpy as np

__all__ = [
    "METHODS",
    "CapacityError",
    "PartitionStats",
    "lower_bound",
    "partition",
    "partition_stats",
]

METHODS = ("greedy", "karmarkar_karp")
_LEFTOVER_MODES = ("raise", "return")
_INF = float("inf")
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
# KK: a run of singletons into a full unit longer than this switches to a heap.
_SHORT_RUN = 64
# Ejection chains: how many overfilling first exchanges are tried per step.
_EJECT_TRIES = 16
# Refinement stops once the makespan is this close to the lower bound: far below step-time
# noise, while the last few 1e-5 of relative gap can cost most of the search time.
_GOOD_ENOUGH = 1e-4
# Improvements smaller than this fraction of the makespan are float noise, not progress.
_REFINE_RTOL = 1e-9
# Re-splits and ejection chains cost far more per step, so they must gain at least this much.
_DEEP_RTOL = 1e-4


class CapacityError(ValueError):
    """An item cannot be placed without exceeding a bin's size capacity."""


@dataclass(frozen=True)
class PartitionStats:
    """Quality of a partition: ``imbalance`` = max/mean, ``gap`` = max/lower_bound."""

    max_cost: float
    mean_cost: float
    imbalance: float
    lower_bound: float
    gap: float


# --------------------------------------------------------------------------- validation


def _as_weights(values, name: str) -> np.ndarray:
    """Return ``values`` as a 1-D float64 array, rejecting negative and non-finite entries."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name} must be finite and non-negative; {name}[{i}] = {arr[i]}")
    return arr


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    return int(k)


def _check_sizes(sizes, capacity, n: int) -> tuple[np.ndarray | None, float]:
    """Validate the optional size constraint; ``(None, inf)`` means unconstrained."""
    if sizes is None and capacity is None:
        return None, _INF
    if capacity is None:
        raise ValueError("sizes given without capacity; pass capacity= to bound each bin's size")
    if sizes is None:
        raise ValueError("capacity given without sizes; pass sizes= (one per cost)")
    s = _as_weights(sizes, "sizes")
    if s.size != n:
        raise ValueError(f"sizes has length {s.size} but costs has length {n}")
    cap = float(capacity)
    if not cap >= 0:
        raise ValueError(f"capacity must be non-negative, got {capacity!r}")
    return s, cap


# --------------------------------------------------------------------------- bounds & stats


def lower_bound(costs, k, *, equal_size: bool = False) -> float:
    """Makespan no partition into ``k`` bins can beat: ``max(total/k, largest item)``.

    With ``equal_size`` every bin holds at least ``n // k`` items, so the bin holding the
    largest item also holds ``n // k - 1`` others, at best the smallest ones.  (``n // k``
    rather than ``ceil(n/k)``: when k does not divide n the largest item may sit in a
    short bin, and the ceil version would overstate the bound.)
    """
    c = _as_weights(costs, "costs")
    k = _check_k(k)
    if c.size == 0:
        return 0.0
    largest = float(c.max())
    bound = max(float(c.sum()) / k, largest)
    companions = c.size // k - 1
    if equal_size and companions > 0:
        others = np.delete(c, int(np.argmax(c)))
        smallest = np.partition(others, companions - 1)[:companions]
        bound = max(bound, largest + float(smallest.sum()))
    return bound


def partition_stats(costs, bins, *, equal_size: bool = False) -> PartitionStats:
    """Summarise ``bins`` (as returned by :func:`partition`) over the items they contain."""
    c = _as_weights(costs, "costs")
    if len(bins) < 1:
        raise ValueError("bins must contain at least one bin")
    groups = [np.asarray(b, dtype=np.int64) for b in bins]
    loads = np.array([c[g].sum() for g in groups])
    placed = np.concatenate(groups)
    max_cost = float(loads.max())
    mean_cost = float(loads.sum()) / len(groups)
    bound = lower_bound(c[placed], len(groups), equal_size=equal_size)
    return PartitionStats(
        max_cost=max_cost,
        mean_cost=mean_cost,
        imbalance=max_cost / mean_cost if mean_cost > 0 else 1.0,
        lower_bound=bound,
        gap=max_cost / bound if bound > 0 else 1.0,
    )


# --------------------------------------------------------------------------- shared state


@dataclass
class _Problem:
    """Static description of one partitioning call."""

    costs: np.ndarray
    k: int
    sizes: np.ndarray | None
    capacity: float
    quota: tuple[int, int] | None  # (q, r): each bin gets q or q+1 items, at most r get q+1
    desc: np.ndarray  # all items by descending cost, ties by ascending index

    def totals(self, bin_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-bin cost, size and item count of an assignment (-1 = unplaced)."""
        placed = bin_of >= 0
        b = bin_of[placed]
        loads = np.bincount(b, weights=self.costs[placed], minlength=self.k)
        used = (
            np.bincount(b, weights=self.sizes[placed], minlength=self.k)
            if self.sizes is not None
            else np.zeros(self.k)
        )
        return loads, used, np.bincount(b, minlength=self.k)

    def by_cost(self, items: np.ndarray) -> np.ndarray:
        """``items`` by descending cost, ties by ascending index (never hash or input order)."""
        chosen = np.zeros(self.costs.size, dtype=bool)
        chosen[items] = True
        return self.desc[chosen[self.desc]]


def _roots(link: np.ndarray) -> np.ndarray:
    """Follow merge links (child -> parent) to the root of every node by pointer jumping."""
    while True:
        nxt = link[link]
        if np.array_equal(nxt, link):
            return link
        link = nxt


# --------------------------------------------------------------------------- greedy (LPT)


def _lpt(problem: _Problem, bin_of: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Place ``items`` in the given order, each onto the least-loaded bin that can take it.

    Updates ``bin_of`` in place and returns the items that fit nowhere.  A heap of
    (load, bin) makes this O(n log k); the unconstrained case gets its own tight loop
    because it is the hot path (about 0.5 us per item).
    """
    loads, used, counts = problem.totals(bin_of)
    costs = problem.costs[items].tolist()
    if problem.sizes is None and problem.quota is None:
        chosen = _lpt_free(loads.tolist(), costs)
    else:
        room = (problem.capacity - used).tolist()
        chosen = _lpt_constrained(problem, loads.tolist(), room, counts.tolist(), items, costs)
    chosen = np.asarray(chosen, dtype=np.int64)
    bin_of[items] = chosen
    return items[chosen < 0]


def _lpt_free(loads: list[float], costs: list[float]) -> list[int]:
    heap = [(load, b) for b, load in enumerate(loads)]
    heapq.heapify(heap)
    chosen = []
    append, replace = chosen.append, heapq.heapreplace
    for x in costs:
        load, b = heap[0]
        append(b)
        replace(heap, (load + x, b))
    return chosen


def _lpt_constrained(problem, loads, room, counts, items, costs) -> list[int]:
    """LPT where a bin is eligible only with room for the item and below its count quota.

    Bins without room for the current item wait in a max-heap by room and return to the
    load heap once an item small enough arrives; with sizes falling along the cost order
    (the usual case) every bin is parked O(1) times per item it receives.  Bins that no
    later item fits, or that reached their count, are dropped.  Rooms and eligibility only
    shrink, so an item at least as big as one that failed fails too.
    """
    q, r = problem.quota or (sys.maxsize, 0)
    ceil_bins = counts.count(q + 1)
    limit = q + 1 if ceil_bins < r else q
    sizes = problem.sizes[items] if problem.sizes is not None else np.zeros(len(items))
    later_min = np.append(np.minimum.accumulate(sizes[::-1])[::-1][1:], _INF).tolist()
    sizes = sizes.tolist()
    heap = [(loads[b], b) for b in range(problem.k) if counts[b] < limit]
    heapq.heapify(heap)
    parked = []  # (-room, load, bin): bins too full for a recent item
    chosen = [-1] * len(costs)
    smallest_failed = _INF
    for pos, x in enumerate(costs):
        size = sizes[pos]
        if size >= smallest_failed:
            continue
        while parked and -parked[0][0] >= size:
            _, load, b = heapq.heappop(parked)
            heapq.heappush(heap, (load, b))
        while heap:
            load, b = heap[0]
            if counts[b] >= limit:
                heapq.heappop(heap)
            elif size > room[b]:
                heapq.heappop(heap)
                if room[b] >= later_min[pos]:
                    heapq.heappush(parked, (-room[b], load, b))
            else:
                break
        if not heap:
            smallest_failed = size
            continue
        chosen[pos] = b
        counts[b] += 1
        room[b] -= size
        if counts[b] == q + 1:
            ceil_bins += 1
            limit = q + 1 if ceil_bins < r else q
        if counts[b] < limit:
            heapq.heapreplace(heap, (load + x, b))
        else:
            heapq.heappop(heap)
    return chosen


# --------------------------------------------------------------------------- Karmarkar-Karp


class _Unit:
    """A partial KK solution: k subsets, of which only the non-empty ones are stored.

    Sparse units (fewer than k non-empty subsets) are plain item lists, ``positions``.
    Full units are dense arrays (subset cost, subset id) sorted by cost, for merging with
    other units and short runs of singletons; a long run of singletons (each added to the
    lightest subset) turns them into a min-heap, O(log k) per singleton instead of O(k).
    Converting costs O(k), so each form is built only when needed.
    """

    __slots__ = ("positions", "vals", "parts", "heap", "maxv")

    def __init__(self, positions=None, vals=None, parts=None):
        self.positions, self.vals, self.parts = positions, vals, parts
        self.heap, self.maxv = None, 0.0

    @property
    def full(self) -> bool:
        return self.positions is None

    def spread(self, cs: list[float]) -> float:
        if not self.full:  # positions ascend, so the first is the largest item
            return cs[self.positions[0]]
        if self.heap is None:
            return float(self.vals.max() - self.vals.min())
        return self.maxv - self.heap[0][0]

    def arrays(self, cs_arr: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Dense (subset cost, subset id) of length k; empty subsets are (0, -1)."""
        if not self.full:
            pos = np.asarray(self.positions, dtype=np.int64)
            vals, parts = np.zeros(k), np.full(k, -1, dtype=np.int64)
            vals[: pos.size], parts[: pos.size] = cs_arr[pos], pos
            return vals, parts
        if self.heap is not None:
            flat = itertools.chain.from_iterable(self.heap)
            pairs = np.fromiter(flat, dtype=np.float64, count=2 * k).reshape(k, 2)
            self.vals, self.parts, self.heap = pairs[:, 0], pairs[:, 1].astype(np.int64), None
        return self.vals, self.parts

    def as_heap(self) -> list:
        if self.heap is None:
            self.heap = list(zip(self.vals.tolist(), self.parts.tolist()))
            heapq.heapify(self.heap)
            self.maxv, self.vals, self.parts = float(self.vals.max()), None, None
        return self.heap


def _merge_dense(av, ap, bv, bp, link: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LDM combination: heaviest subset of one side with the lightest of the other.

    Returns the merged (subset cost, subset id) sorted by ascending cost.
    """
    ia = np.argsort(-av, kind="stable")
    ib = np.argsort(bv, kind="stable")
    pa, pb = ap[ia], bp[ib]
    both = (pa >= 0) & (pb >= 0)
    link[pb[both]] = pa[both]
    vals, parts = av[ia] + bv[ib], np.where(pa >= 0, pa, pb)
    order = np.argsort(vals, kind="stable")
    return vals[order], parts[order]


def _merge_units(u: _Unit, v: _Unit, cs_arr: np.ndarray, k: int, link: np.ndarray) -> _Unit:
    """Merge two composite units; disjoint sparse ones just pool their items."""
    if not u.full and not v.full and len(u.positions) + len(v.positions) < k:
        return _Unit(positions=sorted(u.positions + v.positions))
    return _Unit(None, *_merge_dense(*u.arrays(cs_arr, k), *v.arrays(cs_arr, k), link))


def _absorb_run(unit, j, bar, cs, cs_arr, neg_cs, k, link):
    """Merge the next singletons into ``unit`` while they and ``unit`` are the two largest spreads.

    ``bar`` is the largest spread among the other composite units.  For a sparse unit
    the run is a slice found by binary search; for a full one every singleton goes onto
    the lightest subset (an LPT step), until the unit's spread falls behind.
    ``cs`` ends with a -1 sentinel.  Returns the new singleton cursor.
    """
    n = len(cs) - 1
    if not unit.full:
        above = int(np.searchsorted(neg_cs, -bar, side="left"))
        stop = min(max(above, j + 1), j + k - len(unit.positions))
        unit.positions.extend(range(j, stop))
        if len(unit.positions) == k:  # positions ascend, so their costs descend
            unit.vals, unit.parts = unit.arrays(cs_arr, k)
            unit.vals, unit.parts, unit.positions = unit.vals[::-1], unit.parts[::-1], None
        return stop
    if unit.heap is None:
        j, done = _absorb_short_run(unit, j, bar, cs, link)
        if done:
            return j
    heap = unit.as_heap()
    maxv, start, parts = unit.maxv, j, []
    append, replace = parts.append, heapq.heapreplace
    while True:  # the first singleton was chosen by the caller (or the short run)
        lo, part = heap[0]
        load = lo + cs[j]
        replace(heap, (load, part))
        append(part)
        if load > maxv:
            maxv = load
        j += 1
        spread = maxv - heap[0][0]
        if j == n or cs[j] <= bar or spread <= bar or spread < cs[j + 1]:
            break
    link[start:j] = parts
    unit.maxv = maxv
    return j


def _absorb_short_run(unit, j, bar, cs, link) -> tuple[int, bool]:
    """The start of a run of singletons into a sorted full unit, without building a heap.

    Each step re-inserts one subset into the sorted arrays (O(k) memmove, microseconds);
    after ``_SHORT_RUN`` steps the run is long and the caller switches to a heap.
    Returns (cursor, whether the run ended).
    """
    n = len(cs) - 1
    vals, parts = unit.vals, unit.parts
    for _ in range(_SHORT_RUN):
        load, part = vals[0] + cs[j], parts[0]
        at = int(np.searchsorted(vals, load, side="right"))
        vals = np.concatenate((vals[1:at], [load], vals[at:]))
        parts = np.concatenate((parts[1:at], [part], parts[at:]))
        link[j] = part
        j += 1
        spread = vals[-1] - vals[0]
        if j == n or cs[j] <= bar or spread <= bar or spread < cs[j + 1]:
            unit.vals, unit.parts = vals, parts
            return j, True
    unit.vals, unit.parts = vals, parts
    return j, False


def _kk(cs_arr: np.ndarray, k: int) -> np.ndarray:
    """Multiway largest differencing method on costs sorted descending; bin per position.

    Every item starts as a k-tuple (item, 0, ..., 0); the two tuples with the largest
    spread (max - min) are merged heaviest-with-lightest until one remains.  Singletons
    are consumed in descending order from a sorted array and runs of them are merged in
    one step, so the Python work is O(n log k) rather than O(n k).
    """
    n = cs_arr.size
    cs, neg_cs = cs_arr.tolist() + [-1.0], -cs_arr
    link = np.arange(n)
    units: list = []  # max-heap of composite units: (-spread, seq, unit)
    seq = itertools.count()
    j = 0

    def push(unit):
        heapq.heappush(units, (-unit.spread(cs), next(seq), unit))

    while len(units) + n - j > 1:
        best = -units[0][0] if units else -_INF
        second = -min(units[1:3])[0] if len(units) > 1 else -_INF
        x = cs[j] if j < n else -_INF
        y = cs[j + 1] if j + 1 < n else -_INF
        if units and second >= x:  # two composites lead (composites win ties)
            u, v = heapq.heappop(units)[2], heapq.heappop(units)[2]
            push(_merge_units(u, v, cs_arr, k, link))
            continue
        if units and best >= y:  # best composite and singleton j lead
            unit = heapq.heappop(units)[2]
        else:  # singletons j and j+1 lead: start a new unit from j
            unit, j = _Unit(positions=[j]), j + 1
        bar = -units[0][0] if units else -_INF
        j = _absorb_run(unit, j, bar, cs, cs_arr, neg_cs, k, link)
        push(unit)
    return _bins_from_links(link, n)


def _kk_balanced(costs: np.ndarray, k: int) -> np.ndarray:
    """Balanced LDM on costs sorted descending: merge k-tuples of k consecutive items.

    The items are padded with zero-cost dummies to a multiple of k; the dummies are the
    last positions, all inside the final tuple, so no bin gets more than one and the real
    counts differ by at most one.
    """
    n = costs.size
    chunks = -(-n // k)
    cs_arr = np.zeros(chunks * k)
    cs_arr[:n] = costs
    link = np.arange(chunks * k)
    seq = itertools.count()
    tuples = []
    for t in range(chunks):
        vals, parts = cs_arr[t * k : (t + 1) * k], np.arange(t * k, (t + 1) * k)
        tuples.append((-(vals.max() - vals.min()), next(seq), vals, parts))
    heapq.heapify(tuples)
    while len(tuples) > 1:
        _, _, av, ap = heapq.heappop(tuples)
        _, _, bv, bp = heapq.heappop(tuples)
        vals, parts = _merge_dense(av, ap, bv, bp, link)
        heapq.heappush(tuples, (-(vals.max() - vals.min()), next(seq), vals, parts))
    return _bins_from_links(link, n)


def _bins_from_links(link: np.ndarray, n: int) -> np.ndarray:
    """Bin per sorted position from the KK merge links; bin 0 holds the largest item.

    Only the first ``n`` (real) positions count: a subset may be rooted at a dummy.
    """
    roots = _roots(link)[:n]
    first = np.full(link.size, n)
    np.minimum.at(first, roots, np.arange(n))
    used = np.flatnonzero(first < n)
    rank = np.empty(link.size, dtype=np.int64)
    rank[used[np.argsort(first[used])]] = np.arange(used.size)
    return rank[roots]


# --------------------------------------------------------------------------- capacity repair


def _evict_overflow(problem: _Problem, bin_of: np.ndarray) -> np.ndarray:
    """Take items out of over-capacity bins until each fits; returns the evicted items.

    Per bin, evict the smallest item that alone cures the excess, else the largest and
    repeat: few evictions, and small ones are easy to re-place.
    """
    _, used, _ = problem.totals(bin_of)
    over = np.append(used > problem.capacity, False)  # extra slot: bin -1 is "unplaced"
    crowded = np.flatnonzero(over[bin_of])
    crowded = crowded[np.argsort(bin_of[crowded], kind="stable")]
    groups = np.split(crowded, np.flatnonzero(np.diff(bin_of[crowded])) + 1)
    evicted = []
    for group in groups if crowded.size else []:
        items = group.tolist()
        excess = used[bin_of[items[0]]] - problem.capacity
        while excess > 0:
            sizes = problem.sizes[items]
            cures = np.flatnonzero(sizes >= excess)
            pick = int(cures[np.argmin(sizes[cures])]) if cures.size else int(np.argmax(sizes))
            excess -= sizes[pick]
            evicted.append(items.pop(pick))
    evicted = np.asarray(evicted, dtype=np.int64)
    bin_of[evicted] = -1
    return evicted


def _kk_with_capacity(problem: _Problem, bin_of: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Repair a KK plan to respect capacity; never places fewer items than greedy would."""
    evicted = _evict_overflow(problem, bin_of)
    leftovers = _lpt(problem, bin_of, problem.by_cost(evicted))
    if leftovers.size:
        alt = np.full_like(bin_of, -1)
        alt_left = _lpt(problem, alt, problem.by_cost(items))
        if alt_left.size < leftovers.size:
            bin_of[:] = alt
            leftovers = alt_left
    return leftovers


# --------------------------------------------------------------------------- refinement


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


# --------------------------------------------------------------------------- public entry


def partition(
    costs,
    k,
    *,
    method: str = "karmarkar_karp",
    equal_size: bool = False,
    sizes=None,
    capacity=None,
    refine: bool = True,
    leftover: str = "raise",
):
    """Split items into ``k`` bins minimising the heaviest bin's total cost.

    Returns ``k`` int64 index arrays (each sorted by descending cost, then index), or
    ``(bins, unplaced)`` when ``leftover="return"``.  ``method`` is ``"greedy"`` (LPT) or
    ``"karmarkar_karp"`` (largest differencing).  ``equal_size`` makes bin counts differ
    by at most one.  ``sizes``/``capacity`` bound each bin's total size, which is never
    exceeded: items that cannot be placed raise :class:`CapacityError` or are returned as
    ``unplaced`` (ascending).  ``refine`` runs the local search on the construction; it
    stops when no improving exchange is left, within 0.01% of :func:`lower_bound`, or at
    its step/work budget.  Deterministic: ties are broken by index.
    """
    c = _as_weights(costs, "costs")
    k = _check_k(k)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}")
    if leftover not in _LEFTOVER_MODES:
        raise ValueError(f"leftover must be one of {', '.join(_LEFTOVER_MODES)}, got {leftover!r}")
    s, cap = _check_sizes(sizes, capacity, c.size)
    oversize = np.flatnonzero(s > cap) if s is not None else np.empty(0, dtype=np.int64)
    if oversize.size and leftover == "raise":
        i = int(oversize[0])
        raise CapacityError(f"item {i} has size {s[i]:g} > capacity {cap:g}")
    eligible = np.ones(c.size, dtype=bool)
    eligible[oversize] = False
    items = np.flatnonzero(eligible)
    quota = divmod(items.size, k) if equal_size else None
    problem = _Problem(c, k, s, cap, quota, np.argsort(-c, kind="stable"))
    bin_of, leftovers = _construct(problem, items, method)
    if leftovers.size and leftover == "raise":
        i = int(leftovers.min())
        raise CapacityError(
            f"item {i} (size {s[i]:g}) fits in no bin: other items already use the capacity "
            f"{cap:g} of every bin with room for it; {leftovers.size} item(s) could not be "
            "placed, pass leftover='return' to get them back"
        )
    if refine:
        _Refiner(problem, bin_of).run()
    bins = [b.astype(np.int64) for b in _group(problem.desc, bin_of, k)]
    if leftover == "return":
        return bins, np.sort(np.concatenate([oversize, leftovers])).astype(np.int64)
    return bins


def _construct(problem: _Problem, items: np.ndarray, method: str):
    """Initial plan for ``items``: (bin per item with -1 = unplaced, left-over items)."""
    bin_of = np.full(problem.costs.size, -1, dtype=np.int64)
    ordered = problem.by_cost(items)
    if method == "greedy":
        return bin_of, _lpt(problem, bin_of, ordered)
    kk = _kk_balanced if problem.quota is not None else _kk
    bin_of[ordered] = kk(problem.costs[ordered], problem.k)
    if problem.sizes is None:
        return bin_of, np.empty(0, dtype=np.int64)
    return bin_of, _kk_with_capacity(problem, bin_of, items)


@functools.lru_cache(maxsize=None)
def _subset_bits(m: int) -> np.ndarray:
    """All 2**m subsets of m items as rows of 0/1 floats (row i = binary digits of i)."""
    return ((np.arange(2**m)[:, None] >> np.arange(m)) & 1).astype(np.float64)


def _group(ordered: np.ndarray, bin_of: np.ndarray, k: int) -> list[np.ndarray]:
    """Split ``ordered`` items by bin, keeping their order within each bin; unplaced dropped."""
    placed = ordered[bin_of[ordered] >= 0]
    placed = placed[np.argsort(bin_of[placed], kind="stable")]
    counts = np.bincount(bin_of[placed], minlength=k)
    return np.split(placed, np.cumsum(counts)[:-1])
