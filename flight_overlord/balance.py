"""Makespan balancing: place weighted items into k bins so the heaviest bin is as light as possible.

A training step waits for its slowest data-parallel rank (and a rank for its slowest
microbatch), so samples with a compute cost are spread over k bins to minimise the
heaviest bin's total cost.  Pure numpy, no I/O: callers from other frameworks can use it
on plain lists of costs.

Constructions: ``greedy`` (LPT) and ``karmarkar_karp`` (multiway largest differencing).
Both are followed by a local search (``refine``) that moves or swaps items out of the
heaviest bin, which closes most of the gap LPT/LDM leave on skewed cost distributions.
"""

from __future__ import annotations

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
# Refinement stops after this many improving steps per bin (plus a constant); each step is
# O(items per bin) numpy work, so this caps the worst case while typical runs stop far earlier.
_REFINE_STEPS_PER_BIN = 4
_REFINE_MIN_STEPS = 1000
# Partner bins tried per step: the lightest one, then the 32 lightest, then all of them.
_REFINE_WIDTHS = (1, 32)
# From the second width on, this many globally cheapest items are also tried as swap partners.
_REFINE_CHEAPEST = 4096
# Improvements smaller than this fraction of the makespan are float noise, not progress.
_REFINE_RTOL = 1e-9


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

    Bins without room for the current item are parked and pushed back afterwards, and
    dropped for good once no later item fits; bins at their count never return.  Rooms
    and eligibility only shrink, so an item at least as big as one that failed fails too.
    """
    q, r = problem.quota or (sys.maxsize, 0)
    ceil_bins = counts.count(q + 1)
    limit = q + 1 if ceil_bins < r else q
    sizes = problem.sizes[items] if problem.sizes is not None else np.zeros(len(items))
    later_min = np.append(np.minimum.accumulate(sizes[::-1])[::-1][1:], _INF).tolist()
    sizes = sizes.tolist()
    heap = [(loads[b], b) for b in range(problem.k) if counts[b] < limit]
    heapq.heapify(heap)
    chosen = [-1] * len(costs)
    smallest_failed = _INF
    for pos, x in enumerate(costs):
        size = sizes[pos]
        if size >= smallest_failed:
            continue
        parked = []
        while heap:
            load, b = heap[0]
            if counts[b] >= limit:
                heapq.heappop(heap)
            elif size > room[b]:
                entry = heapq.heappop(heap)
                if room[b] >= later_min[pos]:
                    parked.append(entry)
            else:
                break
        if heap:
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
        else:
            smallest_failed = size
        for entry in parked:
            heapq.heappush(heap, entry)
    return chosen


# --------------------------------------------------------------------------- Karmarkar-Karp


class _Unit:
    """A partial KK solution: k subsets, of which only the non-empty ones are stored.

    Sparse units (fewer than k non-empty subsets) are plain item sets: ``positions``.
    Full units keep a min-heap of (subset cost, subset id) so that merging a single item
    (add it to the lightest subset) costs O(log k) instead of O(k).
    """

    __slots__ = ("positions", "heap", "maxv")

    def __init__(self, positions=None, heap=None, maxv=0.0):
        self.positions, self.heap, self.maxv = positions, heap, maxv

    def spread(self, cs: list[float]) -> float:
        if self.heap is None:  # positions ascend, so the first is the largest item
            return cs[self.positions[0]]
        return self.maxv - self.heap[0][0]

    def arrays(self, cs_arr: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Dense (subset cost, subset id) of length k; empty subsets are (0, -1)."""
        if self.heap is not None:
            pairs = np.array(self.heap)
            return pairs[:, 0], pairs[:, 1].astype(np.int64)
        pos = np.asarray(self.positions, dtype=np.int64)
        vals, parts = np.zeros(k), np.full(k, -1, dtype=np.int64)
        vals[: pos.size], parts[: pos.size] = cs_arr[pos], pos
        return vals, parts


def _full_unit(vals: np.ndarray, parts: np.ndarray) -> _Unit:
    heap = list(zip(vals.tolist(), parts.tolist()))
    heapq.heapify(heap)
    return _Unit(heap=heap, maxv=float(vals.max()))


def _merge_dense(av, ap, bv, bp, link: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LDM combination: heaviest subset of one side with the lightest of the other."""
    ia = np.argsort(-av, kind="stable")
    ib = np.argsort(bv, kind="stable")
    pa, pb = ap[ia], bp[ib]
    both = (pa >= 0) & (pb >= 0)
    link[pb[both]] = pa[both]
    return av[ia] + bv[ib], np.where(pa >= 0, pa, pb)


def _merge_units(u: _Unit, v: _Unit, cs_arr: np.ndarray, k: int, link: np.ndarray) -> _Unit:
    """Merge two composite units; disjoint sparse ones just pool their items."""
    if u.heap is None and v.heap is None and len(u.positions) + len(v.positions) <= k:
        pooled = sorted(u.positions + v.positions)
        if len(pooled) < k:
            return _Unit(positions=pooled)
        return _full_unit(cs_arr[pooled], np.asarray(pooled, dtype=np.int64))
    vals, parts = _merge_dense(*u.arrays(cs_arr, k), *v.arrays(cs_arr, k), link)
    return _full_unit(vals, parts)


def _absorb_run(unit, j, bar, cs, cs_arr, neg_cs, k, link):
    """Merge the next singletons into ``unit`` while they and ``unit`` are the two largest spreads.

    ``bar`` is the largest spread among the other composite units.  For a sparse unit
    the run is a slice found by binary search; for a full one every singleton goes onto
    the lightest subset (an LPT step), until the unit's spread falls behind.
    Returns the new singleton cursor.
    """
    n = len(cs)
    if unit.heap is None:
        above = int(np.searchsorted(neg_cs, -bar, side="left"))
        stop = min(max(above, j + 1), j + k - len(unit.positions))
        unit.positions.extend(range(j, stop))
        if len(unit.positions) == k:
            full = _full_unit(cs_arr[unit.positions], np.asarray(unit.positions, dtype=np.int64))
            unit.positions, unit.heap, unit.maxv = None, full.heap, full.maxv
        return stop
    heap, maxv, start, parts = unit.heap, unit.maxv, j, []
    while j < n:
        x = cs[j]
        lo, part = heap[0]
        if j > start:
            spread, nxt = maxv - lo, (cs[j + 1] if j + 1 < n else -1.0)
            if x <= bar or spread <= bar or spread < nxt:
                break
        heapq.heapreplace(heap, (lo + x, part))
        parts.append(part)
        maxv = max(maxv, lo + x)
        j += 1
    link[start:j] = parts
    unit.maxv = maxv
    return j


def _kk(cs_arr: np.ndarray, k: int) -> np.ndarray:
    """Multiway largest differencing method on costs sorted descending; bin per position.

    Every item starts as a k-tuple (item, 0, ..., 0); the two tuples with the largest
    spread (max - min) are merged heaviest-with-lightest until one remains.  Singletons
    are consumed in descending order from a sorted array and runs of them are merged in
    one step, so the Python work is O(n log k) rather than O(n k).
    """
    n = cs_arr.size
    cs, neg_cs = cs_arr.tolist(), -cs_arr
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
    """Local search on the heaviest bin: move one item out or swap it for a lighter one.

    A step is taken only if both touched bins end below the current maximum, so the
    sorted load vector decreases lexicographically and the search terminates.  The best
    partner for every item is found with one ``searchsorted`` on the other side's
    sorted costs, so a step costs O(m log m) numpy work for m items per bin.
    """

    def __init__(self, problem: _Problem, bin_of: np.ndarray):
        self.p, self.bin_of = problem, bin_of
        self.loads, self.used, self.counts = problem.totals(bin_of)
        ascending = problem.desc[::-1]
        self.members = _group(ascending, bin_of, problem.k)  # per bin, ascending cost
        self.cheapest = ascending[bin_of[ascending] >= 0][:_REFINE_CHEAPEST]
        k = problem.k
        self.widths = [w for w in _REFINE_WIDTHS if w < k] + [k]

    def run(self) -> None:
        for _ in range(max(_REFINE_MIN_STEPS, _REFINE_STEPS_PER_BIN * self.p.k)):
            if not self._step():
                return

    def _step(self) -> bool:
        """Apply the best exchange with the lightest bins, widening the search only on failure."""
        h = int(np.argmax(self.loads))
        target = self.loads[h] * (1 - _REFINE_RTOL)
        for width in self.widths:
            step = self._best(h, *self._candidates(h, width))
            if step is not None and step[0] < target:
                self._apply(h, *step[1:])
                return True
        return False

    def _candidates(self, h, width):
        """The ``width`` lightest bins other than ``h``, and the items to swap with.

        Beyond the lightest bin, the globally cheapest items join the swap partners: a
        bin dominated by one huge item (common under ``equal_size``) can only improve by
        trading its small items for even smaller ones, wherever they are.
        """
        if width >= self.p.k:
            return np.arange(self.p.k), np.flatnonzero((self.bin_of >= 0) & (self.bin_of != h))
        dests = np.argpartition(self.loads, width - 1)[:width]
        dests = dests[dests != h]
        pools = [self.members[d] for d in dests] + ([self.cheapest] if width > 1 else [])
        partners = np.unique(np.concatenate(pools or [self.cheapest[:0]]))
        return dests, partners[self.bin_of[partners] != h]

    def _best(self, h, dests, partners):
        """Best (pair max, item, partner or -1, bin) among moves to ``dests`` and swaps with ``partners``."""
        found = [s for s in (self._best_move(h, dests), self._best_swap(h, partners)) if s]
        return min(found, key=lambda s: s[0]) if found else None

    def _best_move(self, h, dests):
        p, A = self.p, self.members[h]
        dests = dests[dests != h]
        if p.quota is not None:  # keep counts within one of each other
            dests = dests[self.counts[dests] < self.counts[h]]
        if A.size == 0 or dests.size == 0:
            return None
        dests = dests[np.argsort(self.loads[dests], kind="stable")]
        if p.sizes is None:
            slot = np.zeros(A.size, dtype=np.int64)
            ok = np.ones(A.size, dtype=bool)
        else:  # lightest bin with room: first index where the running max room suffices
            best_room = np.maximum.accumulate(p.capacity - self.used[dests])
            slot = np.searchsorted(best_room, p.sizes[A], side="left")
            ok = slot < dests.size
            slot = np.minimum(slot, dests.size - 1)
        dest = dests[slot]
        return self._pick(h, A, self.p.costs[A], dest, ok, None)

    def _best_swap(self, h, partners):
        p, A = self.p, self.members[h]
        if A.size == 0 or partners.size == 0:
            return None
        ca = p.costs[A]
        cb = p.costs[partners]
        dest = self.bin_of[partners]
        gap = self.loads[h] - self.loads[dest]
        keep = (gap > 0) & (cb < ca[-1])
        partners, cb, dest, gap = partners[keep], cb[keep], dest[keep], gap[keep]
        idx = np.searchsorted(ca, cb + gap / 2)
        cand = np.concatenate([idx - 1, idx])
        ok = (cand >= 0) & (cand < A.size)
        cand = np.clip(cand, 0, A.size - 1)
        partners, cb, dest = (np.tile(v, 2) for v in (partners, cb, dest))
        return self._pick(h, A[cand], ca[cand] - cb, dest, ok, partners)

    def _pick(self, h, items, delta, dest, ok, partners):
        """Choose the exchange minimising max(new load of h, new load of dest)."""
        p = self.p
        gap = self.loads[h] - self.loads[dest]
        ok = ok & (delta > 0) & (delta < gap)
        if p.sizes is not None:
            ds = p.sizes[items] - (p.sizes[partners] if partners is not None else 0.0)
            ok &= (self.used[dest] + ds <= p.capacity) & (self.used[h] - ds <= p.capacity)
        if not ok.any():
            return None
        pair_max = np.maximum(self.loads[h] - delta, self.loads[dest] + delta)
        i = int(np.argmin(np.where(ok, pair_max, _INF)))
        partner = int(partners[i]) if partners is not None else -1
        return float(pair_max[i]), int(items[i]), partner, int(dest[i])

    def _apply(self, h, item, partner, dest):
        self._relocate(item, h, dest)
        if partner >= 0:
            self._relocate(partner, dest, h)

    def _relocate(self, item, src, dst):
        p = self.p
        cost, size = p.costs[item], (p.sizes[item] if p.sizes is not None else 0.0)
        src_members = self.members[src]
        self.members[src] = src_members[src_members != item]
        dst_members = self.members[dst]
        at = np.searchsorted(p.costs[dst_members], cost)
        self.members[dst] = np.insert(dst_members, at, item)
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
    ``(bins, unplaced)`` when ``leftover="return"``.  ``equal_size`` makes bin counts
    differ by at most one; ``sizes``/``capacity`` bound each bin's total size, which is
    never exceeded: items that cannot be placed raise :class:`CapacityError` or are
    returned as ``unplaced`` (ascending).  See the module docstring for the methods.
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
            f"item {i} of size {s[i]:g} fits in no bin (capacity {cap:g}); "
            f"{leftovers.size} item(s) could not be placed, pass leftover='return' to get them back"
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


def _group(ordered: np.ndarray, bin_of: np.ndarray, k: int) -> list[np.ndarray]:
    """Split ``ordered`` items by bin, keeping their order within each bin; unplaced dropped."""
    placed = ordered[bin_of[ordered] >= 0]
    placed = placed[np.argsort(bin_of[placed], kind="stable")]
    counts = np.bincount(bin_of[placed], minlength=k)
    return np.split(placed, np.cumsum(counts)[:-1])
