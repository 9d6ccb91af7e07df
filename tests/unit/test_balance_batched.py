"""The microbatch level's batched Karmarkar-Karp (core/balance/kk_columns.py, partition_each): the
same plans as one ``_kk`` per group, and the properties a plan must have on random instances."""
from __future__ import annotations

import numpy as np
import pytest

from flight_overlord.core.balance import lower_bound, partition_each
from flight_overlord.core.balance.karmarkar_karp import _SHORT_RUN, _kk
from flight_overlord.core.balance.kk_columns import kk_columns


def _rows(rng, groups: int, width: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Each row's costs descending: continuous, rounded (many ties, zeros) or a few giants first (one
    unit then takes a run of more than _SHORT_RUN singletons, where _kk switches to a heap)."""
    lengths = rng.integers(0, width + 1, groups)
    lengths[0] = lengths[-1] = width  # the first and the last row full: no reads past the matrix
    cs = np.zeros((groups, width))
    for g, n in enumerate(lengths):
        if kind == "continuous":
            c = rng.lognormal(5, 1.2, n)
        elif kind == "ties":
            c = np.round(rng.integers(1, 1200, n) * rng.choice([1.0, 1.5], n), -2)
            c[rng.random(n) < 0.05] = 0.0
        else:
            c = rng.integers(1, 50, n).astype(float)
            c[: rng.integers(1, 3)] = 1e5
        cs[g, :n] = np.sort(c)[::-1]
    return cs, lengths


@pytest.mark.parametrize("kind", ["continuous", "ties", "giants"])
@pytest.mark.parametrize("k", [2, 3, 5, 12])
def test_kk_columns_plans_what_kk_plans_for_every_group(kind, k):
    rng = np.random.default_rng([k, len(kind)])
    width = 3 * _SHORT_RUN if kind == "giants" else 90
    cs, lengths = _rows(rng, 40, width, kind)
    bins = kk_columns(cs, lengths, k)
    for g, n in enumerate(lengths):
        assert bins[g, :n].tolist() == _kk(cs[g, :n].copy(), k).tolist(), (kind, k, g)
        assert (bins[g, n:] == -1).all()


@pytest.mark.parametrize("seed", range(6))
def test_batched_karmarkar_karp_places_every_item_once_within_capacity_and_balances(seed):
    """Random ranks of long-tailed samples over k microbatches: every sample in one bin or unplaced,
    no bin over capacity, never more unplaced than greedy, and where capacity does not bind the sum of
    the groups' heaviest bins no worse than greedy's."""
    rng = np.random.default_rng(seed)
    n, n_groups, k = int(rng.integers(500, 3000)), int(rng.integers(5, 60)), int(rng.integers(2, 9))
    lengths = np.minimum(rng.lognormal(6, 1.1, n), 8000).round()
    costs, sizes = lengths + lengths ** 2 / 4096, lengths
    groups = np.array_split(rng.permutation(n), n_groups)
    for capacity, binding in ((float(np.ceil(1.4 * n / n_groups / k * lengths.mean())), True),
                              (float(lengths.max() * 2 + lengths.sum() / n_groups / k), False)):
        kk = partition_each(costs, groups, k, method="karmarkar_karp", sizes=sizes, capacity=capacity)
        greedy = partition_each(costs, groups, k, method="greedy", sizes=sizes, capacity=capacity)
        heaviest = {"kk": 0.0, "greedy": 0.0}
        for g, (bins, left), (g_bins, g_left) in zip(groups, kk, greedy):
            assert len(bins) == k
            assert sorted(np.concatenate(bins + [left]).tolist()) == list(range(g.size))
            assert all(sizes[g[b]].sum() <= capacity for b in bins)
            assert left.size <= g_left.size
            heaviest["kk"] += max(costs[g[b]].sum() for b in bins)
            heaviest["greedy"] += max(costs[g[b]].sum() for b in g_bins)
            if not binding:
                assert left.size == 0
                assert max(costs[g[b]].sum() for b in bins) <= 1.1 * lower_bound(costs[g], k)
        if not binding:
            assert heaviest["kk"] <= heaviest["greedy"] * (1 + 1e-3)
