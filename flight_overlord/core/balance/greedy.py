"""Greedy LPT construction: each item, heaviest first, onto the least-loaded bin that can take it."""

from __future__ import annotations

import heapq
import sys

import numpy as np

from .problem import _INF, _Problem


def construct(problem: _Problem, items: np.ndarray) -> np.ndarray:
    """LPT plan for ``items`` (by descending cost): bin per item, -1 where none can take it."""
    bin_of = np.full(problem.costs.size, -1, dtype=np.int64)
    _lpt(problem, bin_of, items)
    return bin_of


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
