"""Karmarkar-Karp construction: multiway largest differencing, equal-count variant, capacity repair."""

from __future__ import annotations

import bisect
import heapq
import itertools

import numpy as np

from .greedy import _lpt, lpt_prefix
from .problem import _INF, _Problem

# A run of singletons into a full unit longer than this switches to a heap.
_SHORT_RUN = 64
# From this many bins on, runs of singletons into a full unit go in vectorised LPT rounds.
_ROUNDS_MIN_BINS = 64


def construct(problem: _Problem, items: np.ndarray) -> np.ndarray:
    """KK plan for ``items`` (by descending cost), repaired to fit; -1 where nothing can take one."""
    bin_of = np.full(problem.costs.size, -1, dtype=np.int64)
    kk = _kk_balanced if problem.quota is not None else _kk
    bin_of[items] = kk(problem.costs[items], problem.k)
    if problem.sizes is not None:
        _kk_with_capacity(problem, bin_of, items)
    return bin_of


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
            if self.vals.size < _ROUNDS_MIN_BINS:  # a few bins: two reductions on a list, same doubles
                vals = self.vals.tolist()
                return max(vals) - min(vals)
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
    if k >= _ROUNDS_MIN_BINS:
        return _absorb_rounds(unit, j, bar, cs_arr, k, link)
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


def _absorb_rounds(unit, j, bar, cs_arr, k, link) -> int:
    """``_absorb_run`` for a full unit of many subsets: the run in LPT rounds (greedy.lpt_prefix).

    Each round sorts the subsets by (cost, id), gives the next singletons one each while
    that is what LPT does, and cuts the round where the run's stop rule first holds (the
    next singleton no longer leads: it or the unit's spread falls to ``bar``, or the
    spread below the singleton after it).  Vectorised, so a run costs O(k log k) per round.
    """
    n = cs_arr.size
    vals, parts = unit.arrays(cs_arr, k)
    vals, maxv = vals.copy(), float(vals.max())
    while True:
        order = np.argsort(vals + 1j * parts, kind="stable")  # by (cost, id) as lexsort, ~4x faster
        lv, lp = vals[order], parts[order]
        m = min(k, n - j)
        cand = lv[:m] + cs_arr[j : j + m]
        t = lpt_prefix(lv, lp.astype(np.float64), cand)
        top = np.maximum.accumulate(np.maximum(cand[:t], maxv))
        waiting = np.append(lv[1 : t + 1], _INF) if t == k else lv[1 : t + 1]
        spread = top - np.minimum(np.minimum.accumulate(cand[:t]), waiting[:t])
        nxt, after = _ahead(cs_arr, j + 1, t), _ahead(cs_arr, j + 2, t)
        stop = np.flatnonzero((nxt <= bar) | (spread <= bar) | (spread < after) | (nxt < 0))
        if stop.size:
            t = int(stop[0]) + 1
        vals[order[:t]] = cand[:t]
        link[j : j + t] = lp[:t]
        j, maxv = j + t, float(top[t - 1])
        if stop.size:
            unit.vals, unit.parts = vals, parts
            return j


def _ahead(cs_arr: np.ndarray, start: int, length: int) -> np.ndarray:
    """``cs_arr[start : start + length]``, with the loop's -1 sentinel past the end."""
    window = cs_arr[start : start + length]
    return window if window.size == length else np.append(window, [-1.0] * (length - window.size))


def _absorb_short_run(unit, j, bar, cs, link) -> tuple[int, bool]:
    """The start of a run of singletons into a sorted full unit, without building a heap.

    Each step re-inserts one subset into the sorted arrays (O(k) memmove, microseconds);
    after ``_SHORT_RUN`` steps the run is long and the caller switches to a heap.
    Returns (cursor, whether the run ended).
    """
    n = len(cs) - 1
    vals, parts = unit.vals, unit.parts
    if vals.size < _ROUNDS_MIN_BINS:  # few bins (a rank's microbatches): the same steps on lists
        return _absorb_short_run_lists(unit, j, bar, cs, link)
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


def _absorb_short_run_lists(unit, j, bar, cs, link) -> tuple[int, bool]:
    """``_absorb_short_run`` on Python lists: for a few bins numpy's per-call cost is most of each
    step. The same additions and the same insertion point (bisect_right = searchsorted right)."""
    n = len(cs) - 1
    vals, parts = unit.vals.tolist(), unit.parts.tolist()
    ended = False
    for _ in range(_SHORT_RUN):
        load, part = vals[0] + cs[j], parts[0]
        at = bisect.bisect_right(vals, load)
        del vals[0], parts[0]
        vals.insert(at - 1, load)
        parts.insert(at - 1, part)
        link[j] = part
        j += 1
        spread = vals[-1] - vals[0]
        if j == n or cs[j] <= bar or spread <= bar or spread < cs[j + 1]:
            ended = True
            break
    unit.vals, unit.parts = np.array(vals, dtype=unit.vals.dtype), np.array(parts, dtype=unit.parts.dtype)
    return j, ended


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


def _roots(link: np.ndarray) -> np.ndarray:
    """Follow merge links (child -> parent) to the root of every node by pointer jumping."""
    while True:
        nxt = link[link]
        if np.array_equal(nxt, link):
            return link
        link = nxt


# --------------------------------------------------------------------------- capacity repair


def _evict_overflow(problem: _Problem, bin_of: np.ndarray) -> np.ndarray:
    """Take items out of over-capacity bins until each fits; returns the evicted items.

    Per bin, evict the smallest item that alone cures the excess, else the largest and
    repeat: few evictions, and small ones are easy to re-place.
    """
    used = problem.used(bin_of)
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
    if not evicted.size:  # the plan fits (usual at the rank level): nothing to re-place
        return evicted
    leftovers = _lpt(problem, bin_of, problem.by_cost(evicted))
    if leftovers.size:
        alt = np.full_like(bin_of, -1)
        alt_left = _lpt(problem, alt, problem.by_cost(items))
        if alt_left.size < leftovers.size:
            bin_of[:] = alt
            leftovers = alt_left
    return leftovers

