"""Shared ground of the balancers: input validation, the _Problem of one call, lower bound and stats."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

_LEFTOVER_MODES = ("raise", "return")
_INF = float("inf")


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


def _check_leftover(leftover: str) -> None:
    if leftover not in _LEFTOVER_MODES:
        raise ValueError(f"leftover must be one of {', '.join(_LEFTOVER_MODES)}, got {leftover!r}")


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


def _split_oversize(s: np.ndarray | None, cap: float, n: int, leftover: str):
    """(eligible items ascending, items larger than the capacity); raises on the latter if asked."""
    oversize = np.flatnonzero(s > cap) if s is not None else np.empty(0, dtype=np.int64)
    if oversize.size and leftover == "raise":
        i = int(oversize[0])
        raise CapacityError(f"item {i} has size {s[i]:g} > capacity {cap:g}")
    eligible = np.ones(n, dtype=bool)
    eligible[oversize] = False
    return np.flatnonzero(eligible), oversize


def _leftover_error(sizes: np.ndarray, capacity: float, leftovers: np.ndarray) -> CapacityError:
    i = int(leftovers.min())
    return CapacityError(
        f"item {i} (size {sizes[i]:g}) fits in no bin: other items already use the capacity "
        f"{capacity:g} of every bin with room for it; {leftovers.size} item(s) could not be "
        "placed, pass leftover='return' to get them back"
    )


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
        return loads, self.used(bin_of), np.bincount(b, minlength=self.k)

    def used(self, bin_of: np.ndarray) -> np.ndarray:
        """Per-bin size of an assignment (-1 = unplaced); zeros without sizes."""
        if self.sizes is None:
            return np.zeros(self.k)
        placed = bin_of >= 0
        return np.bincount(bin_of[placed], weights=self.sizes[placed], minlength=self.k)

    def by_cost(self, items: np.ndarray) -> np.ndarray:
        """``items`` by descending cost, ties by ascending index (never hash or input order)."""
        chosen = np.zeros(self.costs.size, dtype=bool)
        chosen[items] = True
        return self.desc[chosen[self.desc]]


def _group(ordered: np.ndarray, bin_of: np.ndarray, k: int) -> list[np.ndarray]:
    """Split ``ordered`` items by bin, keeping their order within each bin; unplaced dropped."""
    placed = ordered[bin_of[ordered] >= 0]
    keys = bin_of[placed]
    if k <= 1 << 16:  # a stable sort of 16-bit keys is a radix sort: O(n)
        keys = keys.astype(np.uint16)
    placed = placed[np.argsort(keys, kind="stable")]
    ends = np.cumsum(np.bincount(bin_of[placed], minlength=k)).tolist()
    return [placed[start:end] for start, end in zip([0] + ends[:-1], ends)]
