"""Benchmark flight_overlord.balance on skewed LLM-style sample-length mixtures.

Usage: python -m benchmarks.balance.balancers [--quick]

Prints markdown tables (for docs/methods/balance.md): imbalance, makespan over the lower
bound, simulated step-time speedup over arrival-order chunking, and plan latency, at
the rank level and the microbatch level, plus the latency of the 4096 x 72 speed target.
"""

from __future__ import annotations

import platform

import numpy as np

from benchmarks.common.benchlib import argument_parser, command_line, timed_runs
from flight_overlord.balance import lower_bound, partition

MICROBATCHES = 8
DP_SIZES = (8, 64, 512, 4096)
CONTEXTS = (4096, 32768)
# Cost of a sample of l tokens: per transformer layer the Megatron FLOPs estimate is
# 24*l*h^2 (matmuls) + 4*l^2*h (attention scores), i.e. proportional to l + l^2/(6h).
# h = 4096 (a 7B-class model) gives the constant below.
HIDDEN = 4096
QUADRATIC = 6 * HIDDEN
SEED = 0


def sample_lengths(rng: np.random.Generator, n: int, ctx: int) -> np.ndarray:
    """70% caption-like (~50 tokens), 25% medium (~800), 5% long documents up to ``ctx``."""
    kind = rng.choice(3, size=n, p=[0.70, 0.25, 0.05])
    caption = rng.lognormal(np.log(48), 0.6, n)
    medium = rng.lognormal(np.log(768), 0.7, n)
    long_doc = np.exp(rng.uniform(np.log(ctx / 16), np.log(ctx), n))  # log-uniform
    lengths = np.choose(kind, [caption, medium, long_doc])
    return np.clip(np.rint(lengths), 1, ctx)


def cost(lengths: np.ndarray) -> np.ndarray:
    return lengths + lengths**2 / QUADRATIC


def step_costs(dp: int, ctx: int) -> np.ndarray:
    """Costs of one global step: DP x microbatches x enough samples to fill the context each."""
    rng = np.random.default_rng([SEED, dp, ctx])
    mean_len = sample_lengths(np.random.default_rng(SEED), 200_000, ctx).mean()
    per_microbatch = max(1, round(ctx / mean_len))
    return cost(sample_lengths(rng, dp * MICROBATCHES * per_microbatch, ctx))


def contiguous(n: int, k: int) -> list[np.ndarray]:
    """The no-balancing baseline: k equal-count chunks in arrival order."""
    return np.array_split(np.arange(n), k)


def plan(method: str, costs: np.ndarray, k: int) -> list[np.ndarray]:
    if method == "none":
        return contiguous(costs.size, k)
    return partition(costs, k, method=method)


def timed(method: str, costs: np.ndarray, k: int, reps: int):
    """(bins, median latency in ms) over ``reps`` runs."""
    bins, times = timed_runs(lambda: plan(method, costs, k), reps)
    return bins, 1000 * float(np.median(times))


def max_bin(costs: np.ndarray, bins: list[np.ndarray]) -> float:
    return max(float(costs[b].sum()) for b in bins)


def balance_rows(dp_sizes, reps: int) -> list[str]:
    rows = []
    for level, per_rank in (("rank", 1), ("microbatch", MICROBATCHES)):
        for dp in dp_sizes:
            for ctx in CONTEXTS:
                costs = step_costs(dp, ctx)
                k = dp * per_rank
                bound = lower_bound(costs, k)
                mean = costs.sum() / k
                baseline = None
                for method in ("none", "greedy", "karmarkar_karp"):
                    bins, ms = timed(method, costs, k, reps)
                    top = max_bin(costs, bins)
                    baseline = baseline or top
                    rows.append(
                        f"| {level} | {dp} | {ctx} | {k} | {costs.size} | {method} "
                        f"| {top / mean:.4f} | {top / bound:.4f} | {baseline / top:.2f}x | {ms:.1f} |"
                    )
    return rows


def speed_rows(reps: int) -> list[str]:
    """The latency target: one plan for 4096 bins x 72 items, also with a token capacity."""
    k, per_bin, ctx = 4096, 72, 32768
    lengths = sample_lengths(np.random.default_rng(SEED), k * per_bin, ctx)
    costs = cost(lengths)
    bound = lower_bound(costs, k)
    capacity = max(lengths.max(), 1.1 * lengths.sum() / k)
    runs = [(m, refine, {}) for m in ("greedy", "karmarkar_karp") for refine in (False, True)]
    runs += [(m, True, dict(sizes=lengths, capacity=capacity)) for m in ("greedy", "karmarkar_karp")]
    rows = []
    for method, refine, constraint in runs:
        bins, times = timed_runs(lambda: partition(costs, k, method=method, refine=refine, **constraint), reps)
        label = f"<= {capacity:.0f} tokens" if constraint else "-"
        rows.append(
            f"| {method} | {refine} | {label} | {costs.size} | {max_bin(costs, bins) / bound:.5f} "
            f"| {1000 * np.median(times):.0f} | {1000 * min(times):.0f} |"
        )
    return rows


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="only DP <= 512")
    args = parser.parse_args()
    dp_sizes = [dp for dp in DP_SIZES if dp <= 512] if args.quick else list(DP_SIZES)
    reps = 3
    print(command_line())
    print()
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
        f"single process; latency = median of {reps} runs (time.perf_counter)."
    )
    print()
    print(
        f"Each step: DP x {MICROBATCHES} microbatches, each with enough samples to fill the "
        f"context on average (mixture: 70% caption-like lognormal ~50 tokens, 25% medium "
        f"~800, 5% long documents log-uniform in [ctx/16, ctx]). cost = l + l^2/{QUADRATIC} "
        f"(Megatron per-layer FLOPs 24lh^2 + 4l^2h with h = {HIDDEN})."
    )
    print()
    print(
        "**level = rank**: k = DP bins, one per data-parallel rank (all its samples for the "
        "step; the step waits for the slowest rank). **level = microbatch**: k = DP x "
        f"{MICROBATCHES} bins, one per microbatch (ranks run microbatches in lock-step, so "
        "each round waits for its slowest microbatch). none = contiguous equal-count chunks "
        "in arrival order. max/mean = heaviest bin / mean bin; max/LB = heaviest bin / "
        "lower_bound; speedup = none's heaviest bin / method's heaviest bin (simulated "
        "step time). Both methods run with refine=True (the default)."
    )
    print()
    print("| level | DP | ctx | k | items | method | max/mean | max/LB | speedup vs none | plan ms |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    print("\n".join(balance_rows(dp_sizes, reps)))
    print()
    print(
        "Speed target: one plan for k = 4096 bins x 72 items (same mixture, ctx 32768), "
        "unconstrained and with a per-bin token capacity of 1.1x the mean; latency in ms, "
        "median and best of 5."
    )
    print()
    print("| method | refine | capacity | items | max/LB | median ms | best ms |")
    print("|---|---|---|---:|---:|---:|---:|")
    print("\n".join(speed_rows(5)))


if __name__ == "__main__":
    main()
