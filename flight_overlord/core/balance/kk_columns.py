"""Karmarkar-Karp for many small independent problems at once: every rank's microbatches of a step.

``karmarkar_karp._kk`` on one group of ~72 items over 3 bins is mostly Python overhead (0.1-0.3 ms), and
the microbatch level runs it once per rank: 4,096 calls at 4,096 ranks. Here every group takes one
differencing step per round, in lockstep, each round a few numpy operations over all groups, so the
Python work is O(items per group) rounds instead of O(groups x items).

It follows ``_kk`` step for step, so the plans are the same: the same choice each step (two
composites, the best composite and the next singleton, or the next two singletons, by spread with the
heap's ties: the unit pushed first wins), the same merge of two composites (heaviest subset with
lightest, stable sorts over the same array order) and the same subset orders ``_kk`` keeps (a sparse
unit lists its items by position, then empty subsets; a full one by ascending cost, a singleton's new
subset after equal costs; after a run of ``_SHORT_RUN`` singletons into one unit, a heap of (cost, id)
pairs in heapq's array order).
"""

from __future__ import annotations

import numpy as np

from .karmarkar_karp import _SHORT_RUN, _roots

_NONE = -np.inf
_LAST = np.iinfo(np.int64).max
_PAD = 3


class _Pool:
    """Every group's composite units: subset costs and subset ids (positions, -1 = empty) per slot.

    A slot is live while its spread is finite. ``seq`` is when the unit was last pushed (the heap's
    tie-break); ``sparse`` marks units that are still a plain list of items (fewer than k subsets used),
    ``heap`` units whose subsets are kept as a heapq heap (after a long run of singletons). Laid out
    slot x group (``vals``/``parts``: subset x slot x group), so a unit gathered for many groups is a
    k x groups array whose rows are long.
    """

    def __init__(self, groups: int, k: int):
        self.k = k
        self.vals = np.zeros((k, 1, groups))
        self.parts = np.full((k, 1, groups), -1, dtype=np.int64)
        self.spread = np.full((1, groups), _NONE)
        self.seq = np.zeros((1, groups), dtype=np.int64)
        self.sparse = np.zeros((1, groups), dtype=bool)
        self.count = np.zeros((1, groups), dtype=np.int64)
        self.heap = np.zeros((1, groups), dtype=bool)
        self.used = 1  # slots that any group has used (or slot 0): the rest are dead everywhere

    def grow(self) -> None:
        """More slots for every group (a group may need a fresh one for a new unit): half as many again."""
        g, k, more = self.spread.shape[1], self.k, max(2, self.spread.shape[0] // 2)
        self.vals = np.concatenate((self.vals, np.zeros((k, more, g))), axis=1)
        self.parts = np.concatenate((self.parts, np.full((k, more, g), -1, dtype=np.int64)), axis=1)
        self.spread = np.concatenate((self.spread, np.full((more, g), _NONE)))
        self.seq = np.concatenate((self.seq, np.zeros((more, g), dtype=np.int64)))
        self.sparse = np.concatenate((self.sparse, np.zeros((more, g), dtype=bool)))
        self.count = np.concatenate((self.count, np.zeros((more, g), dtype=np.int64)))
        self.heap = np.concatenate((self.heap, np.zeros((more, g), dtype=bool)))

    def unit(self, slots, rows):
        """(costs, ids) of one unit per group, k x len(rows)."""
        return self.vals[:, slots, rows], self.parts[:, slots, rows]

    def store(self, rows, slots, vals, parts, sparse, count, seq: int, heap=False) -> None:
        self.vals[:, slots, rows], self.parts[:, slots, rows], self.heap[slots, rows] = vals, parts, heap
        self.sparse[slots, rows], self.count[slots, rows] = sparse, count
        self.spread[slots, rows] = vals.max(axis=0) - vals.min(axis=0)  # a sparse unit's min is an empty 0
        self.seq[slots, rows] = seq


def kk_columns(cs: np.ndarray, lengths: np.ndarray, k: int) -> np.ndarray:
    """``_kk`` of every row of ``cs`` (groups x width, each row's first ``lengths[g]`` costs descending).

    Returns the bin per position, groups x width (-1 past a row's length).
    """
    groups, width = cs.shape
    if k == 1 or groups == 0:
        return np.where(np.arange(width) < lengths[:, None], 0, -1)
    # past each row's end: -inf for x and y, and one more for the run's look-ahead of a finished group
    padded = np.concatenate((cs, np.full((groups, _PAD), _NONE)), axis=1)
    padded[np.arange(width + _PAD) >= lengths[:, None]] = _NONE
    link = np.arange(groups * width + 1, dtype=np.int64)  # the last: a sink for writes of groups not running
    pool, state, run = _Pool(groups, k), _State(groups, width), _Run(groups, k)
    step = 0
    while True:
        active = state.live + lengths - state.j > 1
        if not active.any():
            break
        step += 1
        deciding = np.flatnonzero(active & ~run.on)
        if deciding.size:
            if (state.live[deciding] >= pool.spread.shape[0]).any():
                pool.grow()
            _decide(pool, state, run, padded, link, deciding, width, step)
        if run.on.any():
            _run_step(pool, state, run, padded, link, step)
    return _bins_from_links(link[:-1], groups, width, lengths)


class _State:
    """Per group: the singleton cursor and the number of live composite units; where its row starts
    in the padded costs (``row_start``) and in the links (``row_base``)."""

    def __init__(self, groups: int, width: int):
        self.j = np.zeros(groups, dtype=np.int64)
        self.live = np.zeros(groups, dtype=np.int64)
        self.row_start = np.arange(groups) * (width + _PAD)
        self.row_base = np.arange(groups) * width


class _Run:
    """Per group, the full unit taking a run of singletons (``_absorb_run``), held out of the pool.

    ``bar`` is the largest spread among the group's other units; ``length`` the singletons taken so
    far in this run (``_kk`` heapifies the unit once it passes ``_SHORT_RUN``). Subsets are rows of
    ``vals``/``parts`` (k x groups): numpy is several times faster along a long row than over many
    rows of k."""

    def __init__(self, groups: int, k: int):
        self.on = np.zeros(groups, dtype=bool)
        self.vals = np.zeros((k, groups))
        self.parts = np.zeros((k, groups), dtype=np.int64)
        self.slot = np.zeros(groups, dtype=np.int64)
        self.bar = np.zeros(groups)
        self.length = np.zeros(groups, dtype=np.int64)
        self.heap = np.zeros(groups, dtype=bool)


def _top_two(spread: np.ndarray, seq: np.ndarray):
    """Per column (group) the leading unit by (spread desc, seq asc), its spread, and the second
    spread; ``spread`` is left with the leader's slot dead (a copy, fancy-indexed by the caller)."""
    first = spread.max(axis=0)
    a = np.where(spread == first, seq, _LAST).argmin(axis=0)
    spread[a, np.arange(spread.shape[1])] = _NONE
    return a, first, spread.max(axis=0)


def _decide(pool: _Pool, state: _State, run: _Run, padded, link, rows, width: int, step: int) -> None:
    """One step of ``_kk``'s main loop in every group not in a run: which two tuples lead, and merge them."""
    spread, seq = pool.spread[: pool.used, rows], pool.seq[: pool.used, rows]
    a, best, second = _top_two(spread, seq)
    j = state.j[rows]
    at = state.row_start[rows] + j
    x, y = padded.ravel()[at], padded.ravel()[at + 1]
    two_units = second >= x  # composites win ties
    unit_single = ~two_units & (best >= y) & (best > _NONE)
    two_singles = ~two_units & ~unit_single
    if two_units.any():  # the second unit, by (spread desc, seq asc), only where two units merge
        rest = spread[:, two_units]
        b = np.where(rest == second[two_units], seq[:, two_units], _LAST).argmin(axis=0)
        _merge_units(pool, state, padded, link, rows[two_units], a[two_units], b, width, step)
    if unit_single.any():
        sparse = unit_single & pool.sparse[a, rows]
        if sparse.any():
            _add_item(pool, state, rows[sparse], a[sparse], j[sparse], x[sparse], step)
        starts = unit_single & ~sparse
        if starts.any():  # a full unit leaves the pool for its run; _run_step takes the first singleton
            r, s = rows[starts], a[starts]
            run.on[r], run.slot[r], run.bar[r], run.length[r] = True, s, second[starts], 0
            (run.vals[:, r], run.parts[:, r]), run.heap[r] = pool.unit(s, r), pool.heap[s, r]
    if two_singles.any():
        _pair_singles(pool, state, rows[two_singles], j[two_singles], x[two_singles], y[two_singles], step)


def _run_step(pool: _Pool, state: _State, run: _Run, padded, link, step: int) -> None:
    """Singleton j onto the lightest subset of every running unit; runs that stop go back to the pool.

    In a list (ascending costs) the lightest is the first subset and its new cost goes after the
    subsets of equal cost (``_absorb_short_run_lists``); in a heap it is heapq's root
    (``heapreplace``). A run stops when the next singleton or the unit no longer leads. Most groups
    run at any time, so this works on every group's row (what it computes for the others is never
    read: a run starts from the pool) rather than gathering the running ones."""
    on, j, vals, parts, flat = run.on, state.j, run.vals, run.parts, padded.ravel()
    at = state.row_start + j
    x = flat[at]
    lightest = parts[0].copy()
    if not ((run.heap | (run.length == _SHORT_RUN)) & on).any():
        vals, parts = _insert_after_equals(vals, parts, vals[0] + x, lightest)
        spread = vals[-1] - vals[0]
    else:
        heap = run.heap & on
        heapify = on & ~heap & (run.length == _SHORT_RUN)
        heap |= heapify
        listed = ~heap
        vals[:, listed], parts[:, listed] = _insert_after_equals(vals[:, listed], parts[:, listed],
                                                                 vals[0, listed] + x[listed], lightest[listed])
        hv, hp = vals[:, heap].T.copy(), parts[:, heap].T.copy()
        if heapify.any():
            _heapify(hv, hp, heapify[heap])
            lightest[heap] = hp[:, 0]
        hv[:, 0] += x[heap]
        _sift_up(hv, hp, np.zeros(hv.shape[0], dtype=np.int64))
        vals[:, heap], parts[:, heap] = hv.T, hp.T
        spread = vals.max(axis=0) - vals.min(axis=0)
        run.heap = heap
    base = state.row_base
    link[np.where(on, base + j, link.size - 1)] = base + lightest
    j += on
    bar = run.bar
    going = (flat[at + 1] > bar) & (spread > bar) & (spread >= flat[at + 2])
    run.vals, run.parts = vals, parts
    run.length += 1
    done = on & ~going
    if done.any():
        r = np.flatnonzero(done)
        pool.store(r, run.slot[r], vals[:, r], parts[:, r], False, pool.k, step, run.heap[r])
        on[r] = False


def _add_item(pool: _Pool, state: _State, rows, a, j, x, step: int) -> None:
    """Singleton j as a new subset of a sparse unit; once it holds k items it is listed by ascending cost."""
    k = pool.k
    (vals, parts), count = pool.unit(a, rows), pool.count[a, rows]
    r = np.arange(rows.size)
    vals[count, r], parts[count, r] = x, j
    count += 1
    now_full = count == k
    vals[:, now_full], parts[:, now_full] = vals[::-1, now_full], parts[::-1, now_full]
    pool.store(rows, a, vals, parts, ~now_full, count, step)
    state.j[rows] += 1


def _merge_units(pool: _Pool, state: _State, padded, link, rows, a, b, width: int, step: int) -> None:
    """The two leading composites merged into the first one's slot (``_merge_units``)."""
    k = pool.k
    (av, ap), (bv, bp) = pool.unit(a, rows), pool.unit(b, rows)
    count = pool.count[a, rows] + pool.count[b, rows]
    pooled = pool.sparse[a, rows] & pool.sparse[b, rows] & (count < k)
    cols = np.arange(rows.size)
    ia = np.argsort(-av, axis=0, kind="stable")
    ib = np.argsort(bv, axis=0, kind="stable")
    pa, pb = ap[ia, cols], bp[ib, cols]
    vals = av[ia, cols] + bv[ib, cols]
    parts = np.where(pa >= 0, pa, pb)
    both = (pa >= 0) & (pb >= 0) & ~pooled
    base = rows * width
    link[(base + pb)[both]] = (base + pa)[both]
    order = np.argsort(vals, axis=0, kind="stable")
    vals, parts = vals[order, cols], parts[order, cols]
    if pooled.any():  # two short item lists: their items by position, then empty subsets
        items = np.concatenate((ap[:, pooled], bp[:, pooled]))
        items = np.sort(np.where(items >= 0, items, _LAST), axis=0)[:k]
        empty = items == _LAST
        items[empty] = -1
        vals[:, pooled] = np.where(empty, 0.0, padded.ravel()[rows[pooled] * (width + _PAD) + items])
        parts[:, pooled] = items
    pool.store(rows, a, vals, parts, pooled, np.where(pooled, count, k), step)
    pool.spread[b, rows] = _NONE
    state.live[rows] -= 1


def _insert_after_equals(vals, parts, load, part):
    """Subsets as rows (k x groups), ascending: without the first, and (load, part) inserted after
    every subset of equal cost."""
    k = vals.shape[0]
    at = (vals[1:] <= load).sum(axis=0)
    slot = np.arange(k)[:, None]
    before, here = slot < at, slot == at  # slots before the new one take the next subset's place
    new_v = np.where(before, np.concatenate((vals[1:], vals[:1])), vals)
    new_p = np.where(before, np.concatenate((parts[1:], parts[:1])), parts)
    return np.where(here, load, new_v), np.where(here, part, new_p)


def _less(v1, p1, v2, p2):
    """(cost, id) tuples compared as Python compares them."""
    return (v1 < v2) | ((v1 == v2) & (p1 < p2))


def _heapify(hv, hp, rows_mask) -> None:
    """``heapq.heapify`` of the rows in ``rows_mask`` (in place)."""
    k = hv.shape[1]
    for i in reversed(range(k // 2)):
        _sift_up(hv, hp, np.where(rows_mask, i, k))


def _sift_up(hv, hp, pos) -> None:
    """``heapq._siftup(heap, pos)`` on every row (in place); rows with ``pos >= k`` are left alone.

    The smaller child moves up until a leaf, then the item sifts back down towards ``pos``."""
    k = hv.shape[1]
    r = np.arange(hv.shape[0])
    start = pos.copy()
    at = np.minimum(pos, k - 1)
    item_v, item_p = hv[r, at], hp[r, at]
    while True:
        child = 2 * pos + 1
        go = child < k
        if not go.any():
            break
        right = np.minimum(child + 1, k - 1)
        left = np.minimum(child, k - 1)
        child = np.where((child + 1 < k) & ~_less(hv[r, left], hp[r, left], hv[r, right], hp[r, right]),
                         right, left)
        child = np.where(go, child, pos)
        hv[r, pos.clip(max=k - 1)] = np.where(go, hv[r, child.clip(max=k - 1)], hv[r, pos.clip(max=k - 1)])
        hp[r, pos.clip(max=k - 1)] = np.where(go, hp[r, child.clip(max=k - 1)], hp[r, pos.clip(max=k - 1)])
        pos = child
    while True:
        parent = np.maximum((pos - 1) >> 1, 0)
        up = (pos > start) & (pos < k) & _less(item_v, item_p, hv[r, parent], hp[r, parent])
        if not up.any():
            break
        at = np.minimum(pos, k - 1)
        hv[r, at] = np.where(up, hv[r, parent], hv[r, at])
        hp[r, at] = np.where(up, hp[r, parent], hp[r, at])
        pos = np.where(up, parent, pos)
    keep = pos < k
    hv[r[keep], pos[keep]], hp[r[keep], pos[keep]] = item_v[keep], item_p[keep]


def _pair_singles(pool: _Pool, state: _State, rows, j, x, y, step: int) -> None:
    """Singletons j and j+1 start a new unit in a free slot (a sparse list of two items)."""
    k = pool.k
    free = (pool.spread[: pool.used + 1, rows] == _NONE).argmax(axis=0)
    pool.used = max(pool.used, int(free.max()) + 1)
    vals = np.zeros((k, rows.size))
    parts = np.full((k, rows.size), -1, dtype=np.int64)
    vals[0], vals[1], parts[0], parts[1] = x, y, j, j + 1
    if k == 2:  # already full: listed by ascending cost
        vals, parts = vals[::-1], parts[::-1]
    pool.store(rows, free, vals, parts, k > 2, 2, step)
    state.j[rows] += 2
    state.live[rows] += 1


def _bins_from_links(link: np.ndarray, groups: int, width: int, lengths: np.ndarray) -> np.ndarray:
    """``karmarkar_karp._bins_from_links`` for every group at once: bins numbered by first position."""
    link = _roots(link)
    real = (np.arange(width)[None, :] < lengths[:, None]).ravel()
    first = np.full(link.size, link.size)
    np.minimum.at(first, link[real], np.flatnonzero(real))
    used = np.flatnonzero(first < link.size)
    used = used[np.argsort(first[used], kind="stable")]
    owner = used // width
    starts = np.searchsorted(owner, np.arange(groups))
    rank = np.empty(link.size, dtype=np.int64)
    rank[used] = np.arange(used.size) - starts[owner]
    return np.where(real, rank[link], -1).reshape(groups, width)
