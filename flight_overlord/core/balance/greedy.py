"""Greedy LPT construction: each item, heaviest first, onto the least-loaded bin that can take it."""

from __future__ import annotations

import heapq
import sys

import numpy as np

from .problem import _INF, _Problem

# From this many bins on, LPT runs in vectorised rounds (below, a heap is faster).
_ROUNDS_MIN_BINS = 64
# A round that places fewer items than this fraction of the bins counts as stalled (ties,
# full bins); after a few of them the rest of the items go to the heap.
_STALL_FRACTION = 8
_MAX_STALLS = 32


def construct(problem: _Problem, items: np.ndarray) -> np.ndarray:
    """LPT plan for ``items`` (by descending cost): bin per item, -1 where none can take it."""
    bin_of = np.full(problem.costs.size, -1, dtype=np.int64)
    _lpt(problem, bin_of, items)
    return bin_of


def _lpt(problem: _Problem, bin_of: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Place ``items`` in the given order, each onto the least-loaded bin that can take it.

    Updates ``bin_of`` in place and returns the items that fit nowhere.  Many bins: in
    rounds (``_lpt_rounds``), exactly the plan of the heap; few bins or items: a heap of
    (load, bin), O(n log k) at about 0.5 us per item.  Ties go to the lowest bin either way.
    """
    loads, used, counts = problem.totals(bin_of)
    if problem.k >= _ROUNDS_MIN_BINS and items.size >= 2 * problem.k:
        chosen = _lpt_rounds(problem, loads, problem.capacity - used, counts, items)
    elif problem.sizes is None and problem.quota is None:
        chosen = _lpt_free(loads.tolist(), problem.costs[items].tolist())
    else:
        room = (problem.capacity - used).tolist()
        chosen = _lpt_constrained(problem, loads.tolist(), room, counts.tolist(), items,
                                  problem.costs[items].tolist())
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


def lpt_prefix(lv: np.ndarray, lb: np.ndarray, cand: np.ndarray) -> int:
    """How many of a round's items LPT puts on the bins in sorted order, one each.

    ``lv``/``lb``: the bins' loads and ids sorted by (load, id); item i of the round (by
    descending cost) would raise bin i to ``cand[i]``.  LPT gives item t to bin t exactly
    while (load, id) of bin t is below every (new load, id) of the bins 0..t-1, i.e. below
    their prefix minimum; complex numbers compare as (real, imag) pairs in numpy.  >= 1.
    """
    m = cand.size
    if m <= 1:
        return m
    placed = np.minimum.accumulate(cand[:-1] + 1j * lb[: m - 1])
    waiting = lv[1:m] + 1j * lb[1:m]
    late = np.flatnonzero(~(waiting < placed))
    return int(late[0]) + 1 if late.size else m


def _lpt_rounds(problem: _Problem, loads, room, counts, items) -> np.ndarray:
    """LPT in rounds: sort the bins by (load, bin), give the next items one each, in order.

    Each round keeps the longest prefix on which this is exactly what the heap would do
    (``lpt_prefix``), that each bin can take (room, count quota) and that does not change
    the quota's limit, so the plan equals the heap's; on long-tailed costs a round places
    nearly k items, making LPT O(n/k) numpy rounds of O(k log k).  A round whose first
    item does not fit its lightest bin, or repeated short rounds, hand the rest to the heap.
    """
    k, costs = problem.k, problem.costs[items]
    sizes = problem.sizes[items] if problem.sizes is not None else np.zeros(items.size)
    loads, room, counts = loads.astype(np.float64), room.astype(np.float64), counts.astype(np.int64)
    q, r = problem.quota or (sys.maxsize, 0)
    bins = np.arange(k, dtype=np.float64)
    chosen = np.full(items.size, -1, dtype=np.int64)
    pos = stalls = 0
    n = items.size
    while pos < n:
        ceil_bins = int(np.count_nonzero(counts == q + 1))
        limit = q + 1 if ceil_bins < r else q
        order = np.argsort(loads, kind="stable")  # by (load, bin): argsort is stable over bin ids
        order = order[counts[order] < limit]
        m = min(order.size, n - pos)
        if m == 0:
            break
        order = order[:m]
        x, size = costs[pos : pos + m], sizes[pos : pos + m]
        cand = loads[order] + x
        t = lpt_prefix(loads[order], bins[order], cand)
        misfit = np.flatnonzero(size[:t] > room[order[:t]])
        if problem.quota is not None and ceil_bins < r:  # the limit drops once r bins hold q+1
            filled = np.flatnonzero(counts[order[:t]] == q)
            if ceil_bins + filled.size >= r:
                t = min(t, int(filled[r - ceil_bins - 1]) + 1)
        if misfit.size:
            t = min(t, int(misfit[0]))
        if t == 0 or (t * _STALL_FRACTION < m and (stalls := stalls + 1) > _MAX_STALLS):
            break
        b = order[:t]
        chosen[pos : pos + t] = b
        loads[b] = cand[:t]
        room[b] -= size[:t]
        counts[b] += 1
        pos += t
    if pos < n:  # the exact heap for the rest, from the loads reached
        rest = items[pos:]
        chosen[pos:] = _lpt_constrained(problem, loads.tolist(), room.tolist(), counts.tolist(), rest,
                                        problem.costs[rest].tolist())
    return chosen


def lpt_columns(costs, sizes, owner, column, groups: int, width: int, k: int, capacity: float) -> np.ndarray:
    """LPT under a capacity for many independent groups at once, each over its own ``k`` bins.

    Items come grouped by ``owner`` and, within a group, by descending cost (``column`` = rank in
    its group). Column by column, every group's item goes onto its least (load, bin) bin with room
    for it, -1 where none has: what ``_lpt_constrained`` does per group without a quota (a bin too
    full for an item waits there until a smaller one comes, its load unchanged). Same additions, so
    the same loads and choices."""
    loads = np.zeros((groups, k))
    room = np.full((groups, k), float(capacity))
    chosen = np.full(costs.size, -1, dtype=np.int64)
    by_column = np.argsort(column, kind="stable")
    ends = np.cumsum(np.bincount(column, minlength=width)).tolist()
    start = 0
    for end in ends:
        at = by_column[start:end]
        start = end
        g, x, size = owner[at], costs[at], sizes[at]
        fits = room[g] >= size[:, None]
        best = np.argmin(np.where(fits, loads[g], np.inf), axis=1)  # first minimum: the lowest bin
        ok = fits[np.arange(g.size), best]
        g, best, at = g[ok], best[ok], at[ok]
        loads[g, best] += x[ok]
        room[g, best] -= size[ok]
        chosen[at] = best
    return chosen
