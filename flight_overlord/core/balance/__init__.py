"""Makespan balancing: place weighted items into k bins so the heaviest bin is as light as possible.

A training step waits for its slowest data-parallel rank (and a rank for its slowest
microbatch), so samples with a compute cost are spread over k bins to minimise the
heaviest bin's total cost.  Pure numpy, no I/O: callers from other frameworks can use it
on plain lists of costs (the package imports only numpy and itself, so it can be vendored).

Constructions (a registry, see :func:`register_balancer`): ``greedy`` (LPT, greedy.py) and
``karmarkar_karp`` (multiway largest differencing, karmarkar_karp.py).  Both are followed by
a local search (``refine``, refine.py) that moves or swaps items out of the heaviest bin,
which closes most of the gap LPT/LDM leave on skewed cost distributions (and under
``equal_size``, where balanced differencing alone can be several % off).  Optional
``sizes``/``capacity`` (e.g. tokens per microbatch) are a hard limit per bin.
Validation, bounds and stats live in problem.py.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import greedy, karmarkar_karp, kk_columns
from .problem import (
    CapacityError,
    PartitionStats,
    _as_weights,
    _check_k,
    _check_leftover,
    _check_sizes,
    _group,
    _leftover_error,
    _Problem,
    _split_oversize,
    lower_bound,
    partition_stats,
)
from .refine import _GOOD_ENOUGH, _Refiner
from .registry import Registry

__all__ = [
    "METHODS",
    "CapacityError",
    "PartitionStats",
    "lower_bound",
    "partition",
    "partition_each",
    "partition_stats",
    "register_balancer",
]

Balancer = Callable[[_Problem, np.ndarray], np.ndarray]
_BALANCERS: Registry = Registry("balancer")


def register_balancer(name: str) -> Callable[[Balancer], Balancer]:
    """Decorator adding a construction algorithm as ``partition(method=name)``.

    The balancer is called as ``fn(problem, items)``: ``problem`` describes the call
    (``costs``, ``k``, ``sizes``/``capacity``, ``quota`` = ``(q, r)`` under ``equal_size``:
    every bin gets q or q+1 items, at most r of them q+1), ``items`` are the placeable
    items by descending cost, ties by index.  It returns one bin (0..k-1) per item of
    ``costs``, -1 for items it leaves unplaced; it must keep ``capacity`` and ``quota``,
    which the refinement then preserves.  Names are unique; ``METHODS`` lists them.
    """
    return _BALANCERS.register(name)


register_balancer("greedy")(greedy.construct)
register_balancer("karmarkar_karp")(karmarkar_karp.construct)


def __getattr__(name: str):
    if name == "METHODS":  # computed, so it always matches the registry
        return tuple(_BALANCERS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    ``(bins, unplaced)`` when ``leftover="return"``.  ``method`` names a registered
    balancer: ``"greedy"`` (LPT), ``"karmarkar_karp"`` (largest differencing) or one added
    with :func:`register_balancer`.  ``equal_size`` makes bin counts differ
    by at most one.  ``sizes``/``capacity`` bound each bin's total size, which is never
    exceeded: items that cannot be placed raise :class:`CapacityError` or are returned as
    ``unplaced`` (ascending).  ``refine`` runs the local search on the construction; it
    stops when no improving exchange is left, within 0.1% of :func:`lower_bound`, or at
    its step/work budget.  Deterministic: ties are broken by index.
    """
    c = _as_weights(costs, "costs")
    k = _check_k(k)
    _BALANCERS[method]  # an unknown name: the error lists the registered balancers
    _check_leftover(leftover)
    s, cap = _check_sizes(sizes, capacity, c.size)
    items, oversize = _split_oversize(s, cap, c.size, leftover)
    quota = divmod(items.size, k) if equal_size else None
    problem = _Problem(c, k, s, cap, quota, np.argsort(-c, kind="stable"))
    bin_of, leftovers = _construct(problem, items, method)
    if leftovers.size and leftover == "raise":
        raise _leftover_error(s, cap, leftovers)
    if refine:
        _Refiner(problem, bin_of).run()
    bins = [b.astype(np.int64, copy=False) for b in _group(problem.desc, bin_of, k)]  # slices: no copy of each
    if leftover == "return":
        return bins, np.sort(np.concatenate([oversize, leftovers])).astype(np.int64)
    return bins


def partition_each(costs, groups, k: int, *, method: str, sizes, capacity, equal_size: bool = False):
    """``partition(costs[g], k, method=..., sizes=sizes[g], capacity=..., leftover="return",
    equal_size=...)`` for every index array ``g`` of ``groups``: the same answers, one per group.

    Over few bins (a rank's microbatches) under a capacity, the construction of all groups runs at
    once: column p of a (groups x items) matrix is every group's p-th item by descending cost. Greedy
    LPT places each column on every group's least (load, bin) bin with room, as the heap does per
    group; Karmarkar-Karp differences every group one step per round (kk_columns.py), and the few
    groups whose plan overfills a bin are repaired one by one, as ``partition`` does. Only the
    refinement and the grouping stay per group."""
    c = _as_weights(costs, "costs")
    s, cap = _check_sizes(sizes, capacity, c.size)
    k = _check_k(k)
    groups = [np.asarray(g, dtype=np.int64) for g in groups]
    if method not in _COLUMNS or equal_size or s is None or k >= greedy._ROUNDS_MIN_BINS or not groups:
        return [partition(c[g], k, method=method, sizes=s[g] if s is not None else None, capacity=capacity,
                          leftover="return", equal_size=equal_size) for g in groups]
    lengths = np.array([g.size for g in groups], dtype=np.int64)
    members = np.concatenate(groups)
    owner = np.repeat(np.arange(len(groups)), lengths)
    local = np.arange(members.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    gc, gs = c[members], s[members]
    # Each group's items by descending cost, ties by index: its own stable argsort of -cost. One stable
    # sort of complex keys (owner, -cost): numpy orders complex numbers by real, then imaginary part,
    # and the members already come by (owner, index); ~8x faster than lexsort of three keys.
    order = np.argsort(owner - 1j * gc, kind="stable")
    starts = np.cumsum(lengths) - lengths
    chosen = _COLUMNS[method](gc[order], gs[order], owner[order], len(groups), k, cap)
    bin_of_all = np.empty(members.size, dtype=np.int64)
    bin_of_all[order] = chosen
    if method == "karmarkar_karp":
        _repair_overfull(gc, gs, bin_of_all, starts, lengths, k, cap)
    placed = bin_of_all >= 0
    unplaced = _per_group(local[~placed], owner[~placed], len(groups))
    # The refinement's first test, for all groups: the heaviest bin already within _GOOD_ENOUGH of
    # the lower bound (loads summed per bin in item order, as its bincount does) ends it at once.
    # The bounds here are summed segment by segment, a few ulps off each group's own sum(): a group
    # that close to the line runs the refinement, whose own first test then decides exactly.
    slot = owner[placed] * k + bin_of_all[placed]
    heaviest = np.bincount(slot, weights=gc[placed], minlength=len(groups) * k).reshape(len(groups), k).max(axis=1)
    sure = _kept_bounds(gc[placed], owner[placed], len(groups), k) * (1 + _GOOD_ENOUGH) * (1 - 1e-9)
    _each_group(np.flatnonzero(heaviest > sure), gc, gs, bin_of_all, starts, lengths, k, cap,
                lambda problem, bin_of: _Refiner(problem, bin_of).run())
    # Each group's bins: its items by descending cost (ties by index) per bin, cut from one sort.
    ranked = order[bin_of_all[order] >= 0]
    ranked = ranked[np.argsort(owner[ranked] * k + bin_of_all[ranked], kind="stable")]
    ends = np.cumsum(np.bincount(owner[ranked] * k + bin_of_all[ranked], minlength=len(groups) * k)).tolist()
    local_ranked = local[ranked]
    cuts = [local_ranked[a:b] for a, b in zip([0] + ends[:-1], ends)]
    return [(cuts[g * k:(g + 1) * k], unplaced[g]) for g in range(len(groups))]


def _lpt_columns(costs, sizes, owner, groups: int, k: int, capacity: float) -> np.ndarray:
    lengths = np.bincount(owner, minlength=groups)
    column = np.arange(owner.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return greedy.lpt_columns(costs, sizes, owner, column, groups, int(lengths.max()), k, capacity)


def _kk_columns(costs, sizes, owner, groups: int, k: int, capacity: float) -> np.ndarray:
    """Karmarkar-Karp of every group's items that fit a bin (the rest stay -1), before the repair."""
    fits = sizes <= capacity
    lengths = np.bincount(owner[fits], minlength=groups)
    column = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    matrix = np.zeros((groups, int(lengths.max(initial=0))))
    matrix[owner[fits], column] = costs[fits]
    chosen = np.full(costs.size, -1, dtype=np.int64)
    chosen[fits] = kk_columns.kk_columns(matrix, lengths, k)[owner[fits], column]
    return chosen


def _repair_overfull(costs, sizes, bin_of_all, starts, lengths, k: int, capacity: float) -> None:
    """``karmarkar_karp._kk_with_capacity`` for the groups whose plan may overfill a bin (in place).

    The per-bin sizes here are summed in another order than the repair's own, so a bin within
    rounding of the capacity is repaired too: the repair's own test then decides exactly."""
    owner = np.repeat(np.arange(lengths.size), lengths)
    placed = bin_of_all >= 0
    used = np.bincount(owner[placed] * k + bin_of_all[placed], weights=sizes[placed], minlength=lengths.size * k)
    overfull = np.flatnonzero((used.reshape(-1, k) > capacity * (1 - 1e-9)).any(axis=1))
    _each_group(overfull, costs, sizes, bin_of_all, starts, lengths, k, capacity, lambda problem, bin_of: (
        karmarkar_karp._kk_with_capacity(problem, bin_of, problem.by_cost(np.flatnonzero(problem.sizes <= capacity)))))


def _each_group(which, costs, sizes, bin_of_all, starts, lengths, k: int, capacity: float, fix) -> None:
    """``fix(problem, bin_of)`` for each group of ``which``: the group's own ``_Problem``, as ``partition``
    makes it, and a copy of its plan, written back into ``bin_of_all`` (groups laid out by ``starts``)."""
    for g in which.tolist():
        start, n = int(starts[g]), int(lengths[g])
        gcost = costs[start:start + n]
        problem = _Problem(gcost, k, sizes[start:start + n], capacity, None, np.argsort(-gcost, kind="stable"))
        bin_of = bin_of_all[start:start + n].copy()
        fix(problem, bin_of)
        bin_of_all[start:start + n] = bin_of


_COLUMNS = {"greedy": _lpt_columns, "karmarkar_karp": _kk_columns}


def _per_group(values: np.ndarray, owner: np.ndarray, groups: int) -> list[np.ndarray]:
    """``values`` (ordered by ``owner``) cut into one array per group 0..groups-1."""
    ends = np.cumsum(np.bincount(owner, minlength=groups)).tolist()
    return [values[a:b] for a, b in zip([0] + ends[:-1], ends)]


def _kept_bounds(costs: np.ndarray, owner: np.ndarray, groups: int, k: int) -> np.ndarray:
    """Per group (``costs`` ordered by ``owner``): max(sum / k, max), the refinement's lower bound
    (up to rounding: summed in another order); 0 for a group with nothing."""
    counts = np.bincount(owner, minlength=groups)
    starts = (np.cumsum(counts) - counts)[counts > 0]
    sums, maxes = np.zeros(groups), np.zeros(groups)
    if starts.size:
        sums[counts > 0] = np.add.reduceat(costs, starts)
        maxes[counts > 0] = np.maximum.reduceat(costs, starts)
    return np.maximum(sums / k, maxes)


def _construct(problem: _Problem, items: np.ndarray, method: str):
    """Initial plan for ``items``: (bin per item with -1 = unplaced, left-over items)."""
    bin_of = np.asarray(_BALANCERS[method](problem, problem.by_cost(items)))
    if bin_of.shape != problem.costs.shape or bin_of.dtype.kind not in "iu":
        raise TypeError(
            f"balancer {method!r} must return one integer bin per cost, "
            f"got dtype {bin_of.dtype} and shape {bin_of.shape}"
        )
    bin_of = bin_of.astype(np.int64, copy=False)
    placed = bin_of >= 0
    leftovers = items[~placed[items]]
    if bin_of.max(initial=-1) >= problem.k or bin_of.min(initial=-1) < -1 or (
        np.count_nonzero(placed) != items.size - leftovers.size
    ):
        raise ValueError(f"balancer {method!r} placed items outside 0..k-1 or items not given to it")
    return bin_of, leftovers
