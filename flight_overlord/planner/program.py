"""The orchestration program for one step: mix, cost, distribute and balance.

Pure given the source feeds: a plan is a function of (config, seed, step, the sizes the
loaders reported), which is what makes runs reproducible whatever the timing.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from .. import balance
from ..config import Config
from ..core.cost import sample_costs
from ..core.mixing import Mixer
from ..core.order import SampleRef
from .feed import SourceFeed

Pick = tuple[SampleRef, int]  # a sample and its token count


@dataclass
class StepPlan:
    step: int
    microbatches: int
    bins: list[list[Pick]]  # bins[dp * microbatches + m]: the samples of one packed microbatch, in order
    weights: dict[str, float]
    stats: dict = field(default_factory=dict)

    def rank_bins(self, dp: int) -> list[list[Pick]]:
        return self.bins[dp * self.microbatches:(dp + 1) * self.microbatches]

    def to_record(self) -> dict:
        return {"step": self.step, "weights": self.weights, "stats": self.stats,
                "bins": [[ref.key for ref, _ in b] for b in self.bins]}


def draw_mixture(feeds: dict[str, SourceFeed], mixer: Mixer, weights: dict[str, float], cfg: Config) -> list[Pick]:
    """The step's samples: sources interleaved by the mixer until the batch is full."""
    gb = cfg.global_batch
    by_tokens = gb.tokens_per_step is not None
    budget = gb.tokens_per_step if by_tokens else gb.samples_per_step
    picks, total = [], 0
    while total < budget:
        source = mixer.choose(weights)
        ref, tokens = feeds[source].next()
        amount = tokens if by_tokens else 1
        mixer.charge(source, amount, weights)
        picks.append((ref, tokens))
        total += amount
    return picks


def fill_in_order(sizes: np.ndarray, k: int, capacity: int) -> tuple[list[np.ndarray], np.ndarray]:
    """No balancing: a conventional loader packs samples in arrival order, one bin after another."""
    bins: list[list[int]] = [[] for _ in range(k)]
    b, used, left = 0, 0, []
    for i, size in enumerate(sizes):
        while b < k and used + size > capacity:
            b, used = b + 1, 0
        if b == k:
            left.append(i)
            continue
        bins[b].append(i)
        used += size
    return [np.array(x, dtype=np.int64) for x in bins], np.array(left, dtype=np.int64)


def balance_two_levels(costs: np.ndarray, sizes: np.ndarray, cfg: Config) -> tuple[list[np.ndarray], np.ndarray]:
    """Inter-microbatch level first (samples onto data-parallel ranks, each holding
    ``microbatches x context_length`` tokens), then intra-rank (each rank's samples onto its
    microbatches of ``context_length``). Balancing ranks as a whole has far more freedom than
    balancing every microbatch bin at once, and the slowest rank is what sets the step time."""
    gb = cfg.global_batch
    method = cfg.balance_method
    rank_indices, unplaced = balance.partition(costs, cfg.mesh.dp, method=method, sizes=sizes,
                                               capacity=gb.microbatches * gb.context_length, leftover="return")
    bins, left = [], [unplaced]
    for idx in rank_indices:
        mb_indices, mb_unplaced = balance.partition(costs[idx], gb.microbatches, method=method, sizes=sizes[idx],
                                                    capacity=gb.context_length, leftover="return")
        bins.extend(idx[b] for b in mb_indices)
        left.append(idx[mb_unplaced])
    return bins, np.sort(np.concatenate(left)).astype(np.int64)


def plan_step(step: int, feeds: dict[str, SourceFeed], mixer: Mixer, cfg: Config,
              weights: dict[str, float] | None = None) -> StepPlan:
    weights = weights or {s.name: s.weight for s in cfg.sources}
    gb = cfg.global_batch
    picks = draw_mixture(feeds, mixer, weights, cfg)
    sizes = np.array([tokens for _, tokens in picks], dtype=np.int64)
    costs = sample_costs(sizes, cfg.cost)
    if cfg.balance_method == "none":
        bin_indices, unplaced = fill_in_order(sizes, cfg.mesh.dp * gb.microbatches, gb.context_length)
    else:
        bin_indices, unplaced = balance_two_levels(costs, sizes, cfg)
    _defer([picks[i] for i in unplaced], feeds, mixer, weights, by_tokens=gb.tokens_per_step is not None)
    bins = [[picks[i] for i in idx] for idx in bin_indices]
    plan = StepPlan(step, gb.microbatches, bins, dict(weights))
    plan.stats = _stats(plan, picks, costs, bin_indices, unplaced, cfg)
    return plan


def _defer(items: list[Pick], feeds, mixer: Mixer, weights, *, by_tokens: bool) -> None:
    """Samples that fit in no microbatch go back, first in line for the next step; the mixer is refunded."""
    by_source: dict[str, list[Pick]] = defaultdict(list)
    for ref, tokens in items:
        by_source[ref.source].append((ref, tokens))
        mixer.refund(ref.source, tokens if by_tokens else 1, weights)
    for source, source_items in by_source.items():
        feeds[source].defer(source_items)


def _stats(plan: StepPlan, picks: list[Pick], costs: np.ndarray, bin_indices, unplaced, cfg: Config) -> dict:
    dp, m = cfg.mesh.dp, plan.microbatches
    placed = np.ones(len(picks), dtype=bool)
    placed[unplaced] = False
    bin_costs = np.array([costs[idx].sum() for idx in bin_indices])
    rank_costs = bin_costs.reshape(dp, m).sum(axis=1)
    # The same samples without balancing: contiguous equal-count chunks per rank, as a
    # conventional per-rank loader would get them.
    order = np.flatnonzero(placed)
    unbalanced = np.array([costs[chunk].sum() for chunk in np.array_split(order, dp)])
    samples, tokens = defaultdict(int), defaultdict(int)
    for (ref, n), ok in zip(picks, placed):
        if ok:
            samples[ref.source] += 1
            tokens[ref.source] += n
    return {
        "samples": dict(samples), "tokens": dict(tokens), "deferred": int(len(unplaced)),
        "imbalance": _max_over_mean(rank_costs), "imbalance_unbalanced": _max_over_mean(unbalanced),
        "microbatch_imbalance": _max_over_mean(bin_costs),
        "max_rank_cost": float(rank_costs.max()), "max_rank_cost_unbalanced": float(unbalanced.max()),
    }


def _max_over_mean(x: np.ndarray) -> float:
    mean = float(np.mean(x)) if len(x) else 0.0
    return float(np.max(x) / mean) if mean > 0 else 1.0
