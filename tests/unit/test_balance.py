"""Tests for flight_overlord.balance: correctness, constraints, determinism and quality."""

from __future__ import annotations

import itertools
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import flight_overlord.balance as public_balance
from flight_overlord.balance import (
    METHODS,
    CapacityError,
    PartitionStats,
    lower_bound,
    partition,
    partition_stats,
    register_balancer,
)
from flight_overlord.core import balance as core_balance

BALANCE_DIR = pathlib.Path(__file__).resolve().parents[2] / "flight_overlord" / "core" / "balance"

# --------------------------------------------------------------------------- helpers


def loads(costs, bins) -> np.ndarray:
    costs = np.asarray(costs, dtype=float)
    return np.array([costs[b].sum() for b in bins])


def makespan(costs, bins) -> float:
    return float(loads(costs, bins).max())


def assert_valid(bins, costs, k, *, placed=None):
    """k int64 arrays, every (placed) index exactly once, each by descending cost then index."""
    costs = np.asarray(costs, dtype=float)
    assert len(bins) == k
    for b in bins:
        assert isinstance(b, np.ndarray) and b.dtype == np.int64
        assert np.all(np.diff(costs[b]) <= 0)
        ties = np.diff(costs[b]) == 0
        assert np.all(np.diff(b)[ties] > 0)
    everything = np.sort(np.concatenate(bins)) if bins else np.empty(0, np.int64)
    expected = np.arange(costs.size) if placed is None else np.sort(placed)
    np.testing.assert_array_equal(everything, expected)


def brute_force(costs, k, *, equal_size=False) -> float:
    """Optimal makespan by enumerating all k**n assignments (n <= 8)."""
    costs = np.asarray(costs, dtype=float)
    assign = np.array(list(itertools.product(range(k), repeat=costs.size)))
    onehot = assign[:, :, None] == np.arange(k)
    bin_loads = np.einsum("anb,n->ab", onehot, costs)
    ok = np.ones(len(assign), dtype=bool)
    if equal_size:
        counts = onehot.sum(axis=1)
        ok = counts.max(axis=1) - counts.min(axis=1) <= 1
    return float(bin_loads.max(axis=1)[ok].min())


def token_cost(lengths):
    return lengths + lengths**2 / 4096


def skewed_lengths(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Sample lengths shaped like captions, long documents or interleaved image-text."""
    if kind == "caption":  # mostly ~40 tokens with a long tail
        raw = rng.lognormal(np.log(40), 0.8, n)
    elif kind == "long_document":
        raw = rng.lognormal(np.log(3000), 1.0, n)
    else:  # image-text: a caption plus 0-2 images of 256/576 tokens, some long interleaved
        images = rng.choice([0, 256, 576, 1152], size=n, p=[0.3, 0.4, 0.2, 0.1])
        raw = rng.lognormal(np.log(80), 0.9, n) + images
    return np.clip(np.rint(raw), 1, 32768)


# --------------------------------------------------------------------------- structure


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("equal_size", [False, True])
@pytest.mark.parametrize("refine", [False, True])
@pytest.mark.parametrize("n,k", [(0, 3), (1, 1), (1, 4), (5, 8), (7, 3), (40, 6), (300, 16)])
def test_every_index_placed_once(method, equal_size, refine, n, k):
    costs = np.random.default_rng(n * 31 + k).exponential(10.0, n)
    bins = partition(costs, k, method=method, equal_size=equal_size, refine=refine)
    assert_valid(bins, costs, k)


@pytest.mark.parametrize("method", METHODS)
def test_zero_and_tied_costs(method):
    costs = [0.0, 2.0, 2.0, 0.0, 2.0, 2.0, 0.0]
    bins = partition(costs, 3, method=method)
    assert_valid(bins, costs, 3)
    assert makespan(costs, bins) == 4.0


def test_greedy_is_lpt_with_lowest_bin_on_ties():
    assert [b.tolist() for b in partition([5, 4, 3, 3], 2, method="greedy", refine=False)] == [
        [0, 3],
        [1, 2],
    ]
    assert [b.tolist() for b in partition([1, 1, 1, 1], 2, method="greedy", refine=False)] == [
        [0, 2],
        [1, 3],
    ]


def test_karmarkar_karp_two_way_is_differencing():
    # 8-7=1, 6-5=1, 4-1=3, 3-1=2: final difference 2 -> bins of 16 and 14 (optimum is 15).
    bins = partition([8, 7, 6, 5, 4], 2, refine=False)
    assert sorted(loads([8, 7, 6, 5, 4], bins)) == [14.0, 16.0]


def test_single_bin_and_more_bins_than_items():
    assert [b.tolist() for b in partition([1, 3, 2], 1)] == [[1, 2, 0]]
    bins = partition([1, 3, 2], 5)
    assert_valid(bins, [1, 3, 2], 5)
    assert makespan([1, 3, 2], bins) == 3.0


# --------------------------------------------------------------------------- optimality


@pytest.mark.parametrize(
    "costs,k,optimum",
    [
        ([3, 3, 2, 2, 2], 2, 6.0),  # LPT gives 7
        ([8, 7, 6, 5, 4], 2, 15.0),  # LPT gives 17, differencing 16
        ([5, 5, 4, 4, 3, 3, 3], 3, 9.0),  # LPT gives 11
        ([12, 11, 9, 8, 8, 8, 7, 7], 3, 24.0),  # LPT and differencing both give 26
        ([12, 10, 10, 9, 8, 8, 6], 3, 22.0),  # both give 24
    ],
)
@pytest.mark.parametrize("method", METHODS)
def test_hand_made_cases_reach_the_optimum(costs, k, optimum, method):
    assert brute_force(costs, k) == optimum
    assert makespan(costs, partition(costs, k, method=method)) == optimum


def test_brute_force_small_cases():
    rng = np.random.default_rng(7)
    optimal = {m: 0 for m in METHODS}
    cases = 120
    for case in range(cases):
        n, k = int(rng.integers(2, 9)), int(rng.choice([2, 3]))
        costs = rng.integers(1, 30, n).astype(float)
        best = brute_force(costs, k)
        assert lower_bound(costs, k) <= best + 1e-9
        for method in METHODS:
            refined = makespan(costs, partition(costs, k, method=method))
            raw = makespan(costs, partition(costs, k, method=method, refine=False))
            assert refined >= best - 1e-9, "beat the optimum: brute force or bins are wrong"
            assert refined <= raw + 1e-9
            optimal[method] += refined <= best + 1e-9
    for method in METHODS:
        assert optimal[method] >= 0.95 * cases, (method, optimal[method])


def test_brute_force_small_cases_equal_size():
    rng = np.random.default_rng(11)
    optimal = 0
    cases = 80
    for _ in range(cases):
        n, k = int(rng.integers(2, 9)), int(rng.choice([2, 3]))
        costs = rng.integers(1, 30, n).astype(float)
        best = brute_force(costs, k, equal_size=True)
        assert lower_bound(costs, k, equal_size=True) <= best + 1e-9
        for method in METHODS:
            refined = makespan(costs, partition(costs, k, method=method, equal_size=True))
            raw = makespan(costs, partition(costs, k, method=method, equal_size=True, refine=False))
            assert best - 1e-9 <= refined <= raw + 1e-9
        optimal += refined <= best + 1e-9
    assert optimal >= 0.9 * cases


def test_equal_size_lower_bound_uses_the_short_bins():
    # 3 items in 2 bins: the largest item may sit alone, so the bound is 10, not 10 + 1.
    assert lower_bound([10, 1, 1], 2, equal_size=True) == 10.0
    assert brute_force([10, 1, 1], 2, equal_size=True) == 10.0
    # 4 items in 2 bins: the largest item has exactly one companion, at best the smallest.
    assert lower_bound([10, 1, 2, 3], 2, equal_size=True) == 11.0
    assert lower_bound([10, 1, 2, 3], 2) == 10.0


# --------------------------------------------------------------------------- equal_size


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("refine", [False, True])
@pytest.mark.parametrize(
    "n,k,expected",
    [(12, 4, [3, 3, 3, 3]), (10, 4, [2, 2, 3, 3]), (3, 5, [0, 0, 1, 1, 1]), (0, 2, [0, 0])],
)
def test_equal_size_counts(method, refine, n, k, expected):
    costs = token_cost(skewed_lengths("caption", n, np.random.default_rng(n)))
    bins = partition(costs, k, method=method, equal_size=True, refine=refine)
    assert_valid(bins, costs, k)
    assert sorted(len(b) for b in bins) == expected


@pytest.mark.parametrize("method", METHODS)
def test_equal_size_counts_on_skewed_data(method):
    rng = np.random.default_rng(3)
    for n, k in [(1000, 64), (1001, 64), (4095, 64), (50, 64)]:
        costs = token_cost(skewed_lengths("long_document", n, rng))
        counts = [len(b) for b in partition(costs, k, method=method, equal_size=True)]
        assert max(counts) - min(counts) <= 1 and sum(counts) == n


# --------------------------------------------------------------------------- capacity


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("equal_size", [False, True])
def test_capacity_never_exceeded(method, equal_size):
    rng = np.random.default_rng(5)
    for trial in range(6):
        k = int(rng.integers(2, 33))
        lengths = skewed_lengths("image_text", int(rng.integers(k, 12 * k)), rng)
        capacity = max(lengths.max(), 1.15 * lengths.sum() / k)
        bins, unplaced = partition(
            token_cost(lengths),
            k,
            method=method,
            equal_size=equal_size,
            sizes=lengths,
            capacity=capacity,
            leftover="return",
        )
        placed = np.setdiff1d(np.arange(lengths.size), unplaced)
        assert_valid(bins, token_cost(lengths), k, placed=placed)
        assert max(lengths[b].sum() for b in bins) <= capacity
        if equal_size:
            counts = [len(b) for b in bins]
            assert max(counts) - min(counts) <= 1 or unplaced.size


def test_karmarkar_karp_plan_is_repaired_to_fit():
    # Give the items of the first unconstrained bin many tokens, so that bin overflows.
    costs = np.array([6.0, 5, 4, 3, 2, 2, 1, 1])
    first = partition(costs, 2, refine=False)[0]
    sizes = np.ones(costs.size)
    sizes[first] = 10
    capacity = sizes[first].sum() - 1
    for refine in (False, True):
        bins = partition(costs, 2, sizes=sizes, capacity=capacity, refine=refine)
        assert_valid(bins, costs, 2)
        assert max(sizes[b].sum() for b in bins) <= capacity
    assert makespan(costs, bins) <= makespan(costs, partition(costs, 2, method="greedy",
                                                                sizes=sizes, capacity=capacity))


def test_item_larger_than_capacity():
    with pytest.raises(CapacityError, match=r"item 2 has size 9 > capacity 8"):
        partition([1, 1, 1], 2, sizes=[1, 1, 9], capacity=8)
    for method in METHODS:
        bins, unplaced = partition(
            [1, 1, 1], 2, method=method, sizes=[1, 1, 9], capacity=8, leftover="return"
        )
        assert unplaced.tolist() == [2]
        assert unplaced.dtype == np.int64
        assert_valid(bins, [1, 1, 1], 2, placed=[0, 1])


@pytest.mark.parametrize("method", METHODS)
def test_items_that_fit_nowhere(method):
    # One bin of 6 tokens: item 0 fits, item 1 then has no room, item 2 still fits.
    costs, sizes = [10, 9, 1], [5, 6, 1]
    with pytest.raises(CapacityError, match=r"item 1 \(size 6\)"):
        partition(costs, 1, method=method, sizes=sizes, capacity=6)
    bins, unplaced = partition(costs, 1, method=method, sizes=sizes, capacity=6, leftover="return")
    assert [b.tolist() for b in bins] == [[0, 2]]
    assert unplaced.tolist() == [1]


def test_leftover_return_without_capacity_returns_empty_unplaced():
    bins, unplaced = partition([3, 2, 1], 2, leftover="return")
    assert_valid(bins, [3, 2, 1], 2)
    assert unplaced.size == 0 and unplaced.dtype == np.int64


def test_capacity_error_is_a_value_error():
    assert issubclass(CapacityError, ValueError)


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("equal_size", [False, True])
def test_deterministic(method, equal_size):
    rng = np.random.default_rng(9)
    lengths = skewed_lengths("image_text", 2000, rng)
    costs = np.round(token_cost(lengths))  # many exact ties
    kwargs = dict(method=method, equal_size=equal_size, sizes=lengths, capacity=lengths.sum() / 20)
    first = partition(costs, 24, **kwargs)
    second = partition(list(costs), 24, **kwargs)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


# --------------------------------------------------------------------------- quality


QUALITY_CASES = [
    (kind, k, per_bin, seed)
    for kind in ("caption", "long_document", "image_text")
    for k, per_bin in [(16, 4), (64, 8), (256, 4), (128, 32)]
    for seed in range(2)
]


@pytest.mark.parametrize("method", METHODS)
def test_makespan_within_one_percent_of_lower_bound(method):
    for kind, k, per_bin, seed in QUALITY_CASES:
        costs = token_cost(skewed_lengths(kind, k * per_bin, np.random.default_rng(seed)))
        stats = partition_stats(costs, partition(costs, k, method=method))
        assert stats.gap <= 1.01, (kind, k, per_bin, seed, stats)


@pytest.mark.parametrize("method", METHODS)
def test_equal_size_within_two_percent_of_lower_bound(method):
    for kind, k, per_bin, seed in QUALITY_CASES:
        costs = token_cost(skewed_lengths(kind, k * per_bin, np.random.default_rng(seed)))
        bins = partition(costs, k, method=method, equal_size=True)
        stats = partition_stats(costs, bins, equal_size=True)
        assert stats.gap <= 1.02, (kind, k, per_bin, seed, stats)


def test_refine_rescues_balanced_differencing():
    # A long tail of documents: equal-count differencing alone is far from the bound.
    rng = np.random.default_rng(0)
    costs = token_cost(np.clip(np.rint(rng.lognormal(5, 1.2, 64 * 16)), 1, 32768))
    raw = partition(costs, 64, equal_size=True, refine=False)
    refined = partition(costs, 64, equal_size=True)
    assert partition_stats(costs, raw, equal_size=True).gap > 1.05
    assert partition_stats(costs, refined, equal_size=True).gap <= 1.02


def test_large_plan_is_fast():
    """Guards against accidental O(n k) work; the benchmark measures the real latency."""
    rng = np.random.default_rng(1)
    costs = token_cost(skewed_lengths("caption", 4096 * 72, rng))
    for method in METHODS:
        start = time.perf_counter()
        bins = partition(costs, 4096, method=method)
        assert time.perf_counter() - start < 5.0
        assert partition_stats(costs, bins).gap <= 1.01


# --------------------------------------------------------------------------- stats & validation


def test_partition_stats():
    stats = partition_stats([4, 2, 2, 0], [np.array([0]), np.array([1, 2, 3])])
    assert stats == PartitionStats(
        max_cost=4.0, mean_cost=4.0, imbalance=1.0, lower_bound=4.0, gap=1.0
    )
    stats = partition_stats([3, 1], [np.array([0, 1]), np.array([], dtype=np.int64)])
    assert (stats.imbalance, stats.gap) == (2.0, 4 / 3)  # bound: max(4 / 2, 3)
    empty = partition_stats([0.0, 0.0], [np.array([0]), np.array([1])])
    assert (empty.imbalance, empty.gap) == (1.0, 1.0)


def test_lower_bound_definition():
    assert lower_bound([], 3) == 0.0
    assert lower_bound([1, 1, 1, 1], 2) == 2.0
    assert lower_bound([5, 1, 1], 2) == 5.0
    # 6 items in 2 bins: the largest is joined by at least the two smallest others.
    assert lower_bound([9, 1, 1, 1, 5, 5], 2, equal_size=True) == 11.0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(costs=[1, -1], k=2), "costs"),
        (dict(costs=[1, float("nan")], k=2), "costs"),
        (dict(costs=[[1, 2]], k=2), "costs"),
        (dict(costs=[1, 2], k=0), "k"),
        (dict(costs=[1, 2], k=1.5), "k"),
        (dict(costs=[1, 2], k=2, method="round_robin"), "round_robin.*greedy.*karmarkar_karp"),
        (dict(costs=[1, 2], k=2, sizes=[1], capacity=4), "sizes"),
        (dict(costs=[1, 2], k=2, sizes=[1, -2], capacity=4), "sizes"),
        (dict(costs=[1, 2], k=2, capacity=4), "capacity"),
        (dict(costs=[1, 2], k=2, sizes=[1, 2]), "capacity"),
        (dict(costs=[1, 2], k=2, sizes=[1, 2], capacity=-1), "capacity"),
        (dict(costs=[1, 2], k=2, leftover="drop"), "leftover"),
    ],
)
def test_validation_errors_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        partition(**kwargs)


def test_lower_bound_and_stats_validate():
    with pytest.raises(ValueError, match="costs"):
        lower_bound([-1.0], 2)
    with pytest.raises(ValueError, match="k"):
        lower_bound([1.0], 0)
    with pytest.raises(ValueError, match="bins"):
        partition_stats([1.0], [])


def test_module_is_self_contained():
    """The balance package runs from its own directory with only numpy, so other frameworks can vendor it."""
    init, folder = str(BALANCE_DIR / "__init__.py"), str(BALANCE_DIR)
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('balance', {init!r}, "
        f"submodule_search_locations=[{folder!r}])\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules['balance'] = module\n"
        "spec.loader.exec_module(module)\n"
        "assert not any(m.startswith(('pyarrow', 'flight_overlord')) for m in sys.modules)\n"
        "assert module.METHODS == ('greedy', 'karmarkar_karp'), module.METHODS\n"
        "bins = module.partition([3, 2, 1], 2)\n"
        "assert [b.tolist() for b in bins] == [[0], [1, 2]], bins\n"
        "print(bins)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


# --------------------------------------------------------------------------- registry


@pytest.fixture
def registry():
    """Leave the balancer registry as it was, whatever the test registered."""
    before = dict(core_balance._BALANCERS)
    yield core_balance._BALANCERS
    core_balance._BALANCERS.clear()
    core_balance._BALANCERS.update(before)


def test_registered_balancer_is_used(registry):
    calls = []

    @register_balancer("mine")
    def round_robin(problem, items):
        calls.append(items.tolist())
        bin_of = np.full(problem.costs.size, -1, dtype=np.int64)
        bin_of[items] = np.arange(items.size) % problem.k
        return bin_of

    assert core_balance.METHODS == ("greedy", "karmarkar_karp", "mine")
    assert public_balance.METHODS == core_balance.METHODS
    costs = [1.0, 5.0, 3.0, 4.0, 2.0]
    bins = partition(costs, 2, method="mine", refine=False)
    assert calls == [[1, 3, 2, 4, 0]]  # placeable items by descending cost
    assert [b.tolist() for b in bins] == [[1, 2, 0], [3, 4]]
    refined = partition(costs, 2, method="mine")  # the refinement runs on custom plans too
    assert_valid(refined, costs, 2)
    assert makespan(costs, refined) == 8.0


def test_registry_rejects_duplicates_and_bad_plans(registry):
    with pytest.raises(ValueError, match="greedy.*already registered"):
        register_balancer("greedy")(lambda problem, items: None)
    with pytest.raises(TypeError, match="name"):
        register_balancer("")
    register_balancer("short")(lambda problem, items: np.zeros(1, dtype=np.int64))
    with pytest.raises(TypeError, match="short"):
        partition([1.0, 2.0], 2, method="short")
    register_balancer("outside")(lambda problem, items: np.full(problem.costs.size, problem.k))
    with pytest.raises(ValueError, match="outside"):
        partition([1.0, 2.0], 2, method="outside")


def test_registry_is_restored_between_tests():
    assert METHODS == core_balance.METHODS == ("greedy", "karmarkar_karp")
    with pytest.raises(ValueError, match="unknown balancer .mine. \\(registered: greedy, karmarkar_karp\\)$"):
        partition([1.0], 1, method="mine")


# --------------------------------------------------------------------------- many bins: vectorised rounds

from flight_overlord.core.balance import greedy as greedy_module  # noqa: E402
from flight_overlord.core.balance import karmarkar_karp as kk_module  # noqa: E402


def long_document_costs(k, per_bin, seed, *, ties=False):
    """Long-document lengths (a*l + b*l^2 costs) for k bins x per_bin items."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(np.log(1500), 1.1, k * per_bin)), 1, 32768)
    costs = token_cost(lengths)
    return lengths, np.round(costs) if ties else costs


def with_and_without_rounds(monkeypatch, module, fn):
    """fn() with vectorised rounds (the default from 64 bins) and with the heap everywhere."""
    rounds = fn()
    monkeypatch.setattr(module, "_ROUNDS_MIN_BINS", 10**9)
    heap = fn()
    monkeypatch.undo()
    return rounds, heap


@pytest.mark.parametrize(
    "constraint",
    ["none", "capacity", "tight_capacity", "equal_size", "capacity_equal_size", "zeros"],
)
def test_greedy_rounds_equal_the_heap_lpt(monkeypatch, constraint):
    """LPT in rounds is not an approximation: the same plan as one item at a time on a heap,
    with ties, zero costs, capacity (also overloaded) and the equal-count quota."""
    k = 96
    lengths, costs = long_document_costs(k, 20, seed=5, ties=True)
    kwargs = {"method": "greedy", "refine": False, "leftover": "return"}
    if "capacity" in constraint:
        scale = 0.9 if constraint == "tight_capacity" else 1.05
        kwargs.update(sizes=lengths, capacity=max(lengths.max(), scale * lengths.sum() / k))
    if "equal_size" in constraint:
        kwargs["equal_size"] = True
    if constraint == "zeros":
        costs[::7] = 0.0
    rounds, heap = with_and_without_rounds(monkeypatch, greedy_module, lambda: partition(costs, k, **kwargs))
    assert [b.tolist() for b in rounds[0]] == [b.tolist() for b in heap[0]]
    assert rounds[1].tolist() == heap[1].tolist()
    if constraint == "tight_capacity":
        assert rounds[1].size > 0  # the overloaded case really left items over


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("k", [64, 1024])
def test_many_bins_quality_capacity_and_determinism(method, k):
    """The rounds' paths at scale: within 1% of the lower bound, capacity never exceeded,
    every item once, and the same plan twice (also from a list)."""
    lengths, costs = long_document_costs(k, 72, seed=k)
    bins = partition(costs, k, method=method)
    assert_valid(bins, costs, k)
    assert partition_stats(costs, bins).gap <= 1.01
    capacity = max(lengths.max(), 1.1 * lengths.sum() / k)  # tighter, the cost bound is out of reach
    kwargs = dict(method=method, sizes=lengths, capacity=capacity, leftover="return")
    capped, unplaced = partition(costs, k, **kwargs)
    assert_valid(capped, costs, k, placed=np.setdiff1d(np.arange(costs.size), unplaced))
    assert max(lengths[b].sum() for b in capped) <= capacity
    assert unplaced.size == 0
    assert partition_stats(costs, capped).gap <= 1.01
    again, _ = partition(list(costs), k, **kwargs)
    assert all(np.array_equal(a, b) for a, b in zip(capped, again))


def test_karmarkar_karp_rounds_keep_the_heap_quality(monkeypatch):
    """KK's runs of singletons in rounds plan as well as the heap version (ties may differ)."""
    k = 256
    _, costs = long_document_costs(k, 40, seed=11)
    rounds, heap = with_and_without_rounds(
        monkeypatch, kk_module, lambda: partition(costs, k, method="karmarkar_karp", refine=False))
    assert_valid(rounds, costs, k)
    assert makespan(costs, rounds) <= makespan(costs, heap) * (1 + 1e-4)
    assert partition_stats(costs, rounds).gap <= 1.01
