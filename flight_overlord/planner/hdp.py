"""The Planner's side of ``distribute("HDP")``: the step's drawn samples onto dynamic CP groups of
the DP x CP domain (``core/hdp.py`` has the rules), checked, and the step's HDP statistics.

A plan's bins are the domain's ranks x microbatches, as for ``distribute("CP")``; a sample on a
group of g ranks is listed in the bin of each of them, so the journal, deferral and the
constructors' fetch bookkeeping (a sample fetched by every constructor whose ranks hold a shard)
work unchanged, and the groups are read back from the bins (``core.hdp.bin_groups``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core import hdp

if TYPE_CHECKING:
    from .strategy import Strategy


def place_hdp(costs: np.ndarray, lengths: np.ndarray, num_buckets: int, microbatches: int, capacity: int,
              strategy: "Strategy") -> tuple[list[np.ndarray], np.ndarray]:
    """(index arrays per bin, unplaced indices), as ``program.place`` returns them; checked. The
    arguments are the step's ``PlanContext`` fields of the same names (``lengths``: its
    ``meta["num_tokens"]``)."""
    placement = hdp.place(costs, lengths, num_buckets, microbatches, capacity, strategy.min_cp, strategy.hdp_widen)
    hdp.check(placement.bins, placement.unplaced, lengths, num_buckets, microbatches, capacity, strategy.min_cp)
    return placement.bins, placement.unplaced


def hdp_groups(plan, buckets) -> dict[str, list[list[list[int]]]]:
    """Per bucket of ``buckets`` (ranks of the domain), microbatch and sample, ``[group size, first rank]``,
    read back from the step plan's ``Pick`` bins: the definition that ``constructor_plans`` computes from the
    columns, kept as the tests' and the HDP benchmark's reference."""
    groups = hdp.bin_groups([[p.ref.key for p in b] for b in plan.bins], plan.num_buckets, plan.microbatches)
    m = plan.microbatches
    return {str(b): [[list(x) for x in groups[b * m + i]] for i in range(m)] for b in buckets}


def _in_order(work: np.ndarray, groups: np.ndarray, placed: np.ndarray, domain: int, microbatches: int) -> np.ndarray:
    """Per-rank work of the same samples on the same group sizes without balancing, the baseline of
    the ``*_unbalanced`` stats: in arrival order, equal-count runs per microbatch, each sample on the
    next aligned group after the previous one (wrapping), as a loader filling ranks in turn would."""
    loads = np.zeros(domain)
    for run in np.array_split(placed, microbatches):
        cursor = 0
        for i in run:
            g = int(groups[i])
            start = -(-cursor // g) * g
            if start + g > domain:
                start = 0
            loads[start:start + g] += work[i]
            cursor = start + g
    return loads


def hdp_stats(costs: np.ndarray, lengths: np.ndarray, bins: list[np.ndarray], domain: int,
              microbatches: int) -> dict:
    """Per-rank work under the THD split (a sample's cost / its group size), the step time it gives
    (sum over microbatches of the slowest rank), idle fraction, and how many tokens and samples
    went through CP groups (what CP communication is paid for)."""
    copies = np.bincount(np.concatenate(bins), minlength=len(costs)) if bins else np.zeros(len(costs), np.int64)
    placed = np.flatnonzero(copies)
    groups = copies  # a sample is in the bin of every rank of its group
    work = costs / np.maximum(groups, 1)
    loads = np.array([work[b].sum() for b in bins]).reshape(domain, microbatches).T  # [m, rank]
    step = float(loads.max(axis=1).sum())
    rank_costs = loads.sum(axis=0)
    mean = float(rank_costs.mean()) if len(rank_costs) else 0.0
    unbalanced = _in_order(work, groups, placed, domain, microbatches)
    return {"hdp": {
        "step_time": step, "idle_fraction": 1.0 - float(loads.sum()) / (step * domain) if step > 0 else 0.0,
        "groups": {str(g): int(n) for g, n in zip(*np.unique(groups[placed], return_counts=True))},
        "cp_tokens": int(lengths[placed][groups[placed] > 1].sum()),
    },
        "imbalance": float(rank_costs.max() / mean) if mean > 0 else 1.0,
        "lower_bound": float(costs[placed].sum()) / domain,  # every sample's work spread over the domain
        "max_rank_cost": float(rank_costs.max()) if len(rank_costs) else 0.0,
        "imbalance_unbalanced": float(unbalanced.max() / unbalanced.mean()) if unbalanced.mean() > 0 else 1.0,
        "max_rank_cost_unbalanced": float(unbalanced.max()),
        "microbatch_imbalance": float(loads.max() / loads.mean()) if loads.size and loads.mean() > 0 else 1.0,
    }
