"""Running the orchestration program for one step: mix, cost, distribute and balance.

Pure given the source feeds and the strategy: a plan is a function of (config, seed, step, the
metadata the loaders reported, journaled feedback), which is what makes runs reproducible
whatever the timing.
"""
from __future__ import annotations

import gc
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

from ..core import balance
from ..core.mesh import Mesh
from ..core.mixing import Mixer
from ..core.packing import round_up
from .feed import Pick, SourceFeed, drawn_table
from .hdp import hdp_stats, place_hdp
from .picks import PickTable
from .step_plan import StepPlan
from .strategy import Strategy

__all__ = ["PlanContext", "StepPlan", "draw_mixture", "place", "plan_step"]


@dataclass
class PlanContext:
    """What ``plan_raw`` sees: the step's drawn samples and the shape of the bins to fill."""
    step: int
    table: PickTable  # the drawn samples as columns (``picks``: as objects, made when asked for)
    meta: dict[str, np.ndarray]  # num_tokens, image_patches, source: one entry per pick
    costs: np.ndarray
    num_buckets: int
    microbatches: int
    capacity: int
    mesh: Mesh
    seq_multiple: int = 1  # slots are padded to this (THD context parallelism)

    @cached_property
    def picks(self) -> list[Pick]:
        return self.table.picks()

    @property
    def sizes(self) -> np.ndarray:
        """The tokens each sample takes in a microbatch: its length, padded to its slot."""
        return round_up(self.meta["num_tokens"], self.seq_multiple)


def draw_mixture(feeds: dict[str, SourceFeed], mixer: Mixer, weights: dict[str, float],
                 strategy: Strategy, step: int = 0) -> list[Pick]:
    """The step's samples: sources interleaved by the mixer until the batch is full. A sample longer
    than a microbatch holds is planned truncated to it (the constructor cuts it the same way)."""
    return _draw(feeds, mixer, weights, strategy, step).picks()


def _draw(feeds: dict[str, SourceFeed], mixer: Mixer, weights: dict[str, float], strategy: Strategy,
          step: int) -> PickTable:
    """``draw_mixture``'s samples as columns (``source``: the index in ``mixer.sources``)."""
    by_tokens = strategy.cfg.global_batch.tokens_per_step is not None
    budget = strategy.batch_at(step)
    longest = strategy.max_sample_tokens_at(step)
    streams = [feeds[source].stream() for source in mixer.sources]
    mix = mixer.run(weights)  # the mixer's choose/charge on plain floats: same choices, no numpy per sample
    try:
        choices = mix.fill(budget, [s.next_tokens for s in streams], by_tokens=by_tokens, longest=longest)
    finally:
        mix.close()
    choices = np.asarray(choices, dtype=np.int64)
    counts = np.bincount(choices, minlength=len(streams))
    if not by_tokens:  # a count per draw: the mixer's choices need no sample, the feeds give theirs at once
        for stream, n in zip(streams, counts.tolist()):
            stream.take(n)
    # Each source's samples in its order, then in the mixer's: draw d is its source's next one.
    by_source = drawn_table(list(enumerate(streams)), mixer.sources)
    position = np.empty(choices.size, dtype=np.int64)
    position[np.argsort(choices, kind="stable")] = np.arange(choices.size)
    table = by_source.take(position)
    return table.with_tokens(np.minimum(table.tokens, longest))


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


def _split(costs, sizes, k: int, capacity: int, method: str, balanced: bool, equal_size: bool = False):
    if balanced:
        return balance.partition(costs, k, method=method, sizes=sizes, capacity=capacity, leftover="return",
                                 equal_size=equal_size)
    return fill_in_order(sizes, k, capacity)


def place(ctx: PlanContext, strategy: Strategy) -> tuple[list[np.ndarray], np.ndarray]:
    """Samples onto ``buckets x microbatches`` bins: (index arrays per bin, indices placed nowhere).

    Inter level first (samples onto buckets, each holding ``microbatches x capacity`` tokens), then
    intra level (each bucket's samples onto its microbatches). Balancing buckets as a whole has far
    more freedom than balancing every bin at once, and the slowest rank sets the step time."""
    if strategy.raw is not None:
        return _checked_raw(ctx, strategy.raw(ctx))
    if strategy.axis == "HDP":
        return place_hdp(ctx.costs, ctx.meta["num_tokens"], ctx.num_buckets, ctx.microbatches, ctx.capacity,
                         strategy)
    b = strategy.balancing
    costs, sizes = ctx.costs, ctx.sizes
    m, cap = ctx.microbatches, ctx.capacity
    if b.method == "none":
        return fill_in_order(sizes, ctx.num_buckets * m, cap)
    inter, intra = b.level in ("both", "inter"), b.level in ("both", "intra")
    groups, left = _groups(ctx, strategy)
    bins = []
    for members, n_buckets in groups:
        buckets, unplaced = _split(costs[members], sizes[members], n_buckets, m * cap, b.method, inter, b.equal_size)
        left.append(members[unplaced])
        ranks = _members(members, buckets)
        if m == 1:  # a bucket is one microbatch, which holds it: partition's answer for k=1, by descending
            # cost, ties by index (as partition's buckets already are: only unbalanced ones need the sort)
            bins.extend([_by_cost(costs, idx)[0] for idx in ranks] if intra and not inter else ranks)
            continue
        if intra:  # every bucket's microbatches in one call: the same as one partition per bucket
            splits = balance.partition_each(costs, ranks, m, method=b.method, sizes=sizes, capacity=cap,
                                            equal_size=b.equal_size)
        else:
            splits = [fill_in_order(sizes[idx], m, cap) for idx in ranks]
        for idx, (mbs, mb_unplaced) in zip(ranks, splits):
            bins.extend(idx[x] for x in mbs)
            left.append(idx[mb_unplaced])
    return bins, np.sort(np.concatenate(left)).astype(np.int64)


def _members(members: np.ndarray, parts: list[np.ndarray]) -> list[np.ndarray]:
    """``[members[p] for p in parts]``, one fancy index for all parts (slices of it after). ``members``
    are ascending and distinct, so ending at ``len - 1`` means they are ``0..len-1``: ``parts`` itself."""
    if len(members) and members[-1] == len(members) - 1:
        return parts
    ends = np.cumsum([len(p) for p in parts]).tolist()
    flat = members[np.concatenate(parts)] if parts else members[:0]
    return [flat[a:b] for a, b in zip([0] + ends[:-1], ends)]


def _by_cost(costs: np.ndarray, idx: np.ndarray) -> list[np.ndarray]:
    """``idx`` as the one bin of ``balance.partition(costs[idx], 1)``: by descending cost, ties in order."""
    return [idx[np.argsort(-costs[idx], kind="stable")]]


def _groups(ctx: PlanContext, strategy: Strategy) -> tuple[list[tuple[np.ndarray, int]], list[np.ndarray]]:
    """``distribute(group_size=g)``: samples are first split over the groups of g buckets (balanced,
    cheaply), then balanced within each group: B/g small problems instead of one large one."""
    everything = np.arange(len(ctx.table), dtype=np.int64)
    g = strategy.group_size
    if not g or g >= ctx.num_buckets:
        return [(everything, ctx.num_buckets)], []
    n_groups = ctx.num_buckets // g
    parts, unplaced = balance.partition(ctx.costs, n_groups, method="greedy", sizes=ctx.sizes,
                                        capacity=g * ctx.microbatches * ctx.capacity, leftover="return")
    return [(np.sort(p), g) for p in parts], [unplaced]


def _checked_raw(ctx: PlanContext, result) -> tuple[list[np.ndarray], np.ndarray]:
    """A user's ``plan_raw`` answer, checked: every sample once, bins within capacity."""
    bins, unplaced = result
    bins = [np.asarray(b, dtype=np.int64) for b in bins]
    unplaced = np.asarray(unplaced, dtype=np.int64)
    expected = ctx.num_buckets * ctx.microbatches
    if len(bins) != expected:
        raise ValueError(f"plan_raw returned {len(bins)} bins; this step has {expected} "
                         f"({ctx.num_buckets} buckets x {ctx.microbatches} microbatches)")
    seen = np.concatenate(bins + [unplaced])
    if len(seen) != len(ctx.table) or not np.array_equal(np.sort(seen), np.arange(len(ctx.table))):
        raise ValueError("plan_raw must place every drawn sample exactly once (in a bin or as unplaced)")
    for i, b in enumerate(bins):
        if ctx.sizes[b].sum() > ctx.capacity:
            raise ValueError(f"plan_raw: bin {i} holds {int(ctx.sizes[b].sum())} tokens, over the capacity "
                             f"{ctx.capacity}")
    return bins, unplaced


def sample_meta(table: PickTable) -> dict[str, np.ndarray]:
    """Per-sample arrays for the cost function."""
    return {"num_tokens": table.tokens, "image_patches": table.patches,
            "source": np.array(table.sources, dtype=object)[table.source]}


def plan_step(step: int, feeds: dict[str, SourceFeed], mixer: Mixer, strategy: Strategy,
              weights: dict[str, float], feedback: dict | None = None, cost_fn=None,
              encoder_cost_fn=None) -> StepPlan:
    """``cost_fn``, ``encoder_cost_fn``: the step's cost models when not the strategy's own (fitted ones)."""
    # A step makes a few objects per sample and frees them with the plan: no reference cycles to
    # find, but at thousands of ranks the cyclic collector's passes over them cost ~20% of the step.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _plan_step(step, feeds, mixer, strategy, weights, feedback, cost_fn or strategy.cost_fn,
                          encoder_cost_fn)
    finally:
        if collecting:
            gc.enable()


def _plan_step(step: int, feeds: dict[str, SourceFeed], mixer: Mixer, strategy: Strategy,
               weights: dict[str, float], feedback: dict | None, cost_fn, encoder_cost_fn) -> StepPlan:
    gb = strategy.cfg.global_batch
    if strategy.buffer_policy is not None:
        summary = {name: feed.summary() for name, feed in feeds.items()}
        weights = dict(strategy.buffer_policy(step, summary, dict(weights)))
    table = _draw(feeds, mixer, weights, strategy, step)
    microbatches = strategy.microbatches_at(step)
    meta = sample_meta(table)
    costs = np.asarray(cost_fn(meta), dtype=np.float64)
    if costs.shape != (len(table),):
        raise ValueError(f"cost function returned shape {costs.shape}, expected ({len(table)},)")
    ctx = PlanContext(step, table, meta, costs, strategy.num_buckets, microbatches, strategy.capacity_at(step),
                      strategy.mesh, strategy.seq_multiple)
    bin_indices, unplaced = place(ctx, strategy)
    bin_indices = [np.asarray(b, dtype=np.int64) for b in bin_indices]
    if len(unplaced) and strategy.balancing.keep_global_batch:
        raise ValueError(f"step {step}: {len(unplaced)} drawn samples fit in no microbatch and "
                         f"keep_global_batch forbids deferring them: raise microbatches or context_length, "
                         f"or lower the step's batch size")
    _defer(table.picks(unplaced), feeds, mixer, weights, by_tokens=gb.tokens_per_step is not None)
    plan = StepPlan.from_table(step, strategy.axis, ctx.num_buckets, microbatches, ctx.capacity, table,
                               bin_indices, dict(weights), feedback)
    source_names = np.array(mixer.sources, dtype=object)
    bins = grouping(bin_indices)
    plan.stats = _stats(plan, meta, table.source, source_names, costs, bins, unplaced)
    if strategy.axis == "HDP":
        plan.stats.update(hdp_stats(costs, meta["num_tokens"], bin_indices, ctx.num_buckets, microbatches))
    if strategy.image_graph is not None:
        plan.encoder_axis = strategy.image_graph.axis
        plan.encoder, plan.stats["encoder"] = place_images(plan.bins, strategy, encoder_cost_fn)
    else:
        plan.stats["encoder"] = _encoder_stats_arrays(meta["image_patches"], table.images(), bins, microbatches)
    return plan


def place_images(bins: list[list[Pick]], strategy: Strategy,
                 cost_fn=None) -> tuple[list[list[tuple[Pick, int]]], dict]:
    """The image graph: every image of the placed samples goes to one encoder bucket, balanced by
    the image cost over ``mesh.num_buckets(axis)`` buckets; (sample, image index) pairs, in order."""
    graph = strategy.image_graph
    units = [(p, i) for b in bins for p in b for i in range(len(p.image_sizes))]
    k = strategy.mesh.num_buckets(graph.axis)
    cost_fn = cost_fn or graph.cost_fn
    costs = _image_costs(units, cost_fn)
    if graph.method == "none":
        parts = np.array_split(np.arange(len(units)), k)
    else:
        parts = balance.partition(costs, k, method=graph.method)
    encoder = [[units[i] for i in np.sort(part)] for part in parts]
    loads = np.array([costs[part].sum() for part in parts])
    # Without the graph, a sample's images are encoded where its sequence goes: every rank of the
    # bucket (the encoder is replicated across its model-parallel peers) carries the bucket's images.
    vanilla = np.array([_image_costs([(p, i) for p in group for i in range(len(p.image_sizes))], cost_fn).sum()
                        for group in _per_bucket(bins, len(bins) // strategy.num_buckets)])
    stats = {"images": len(units), "patches": int(sum(p.image_sizes[i] for p, i in units)),
             "imbalance": max_over_mean(loads), "max_cost": float(loads.max()) if len(loads) else 0.0,
             "lower_bound": float(balance.lower_bound(costs, k)) if len(costs) else 0.0,
             "imbalance_vanilla": max_over_mean(vanilla),
             "max_cost_vanilla": float(vanilla.max()) if len(vanilla) else 0.0}
    return encoder, stats


def _image_costs(units: list[tuple[Pick, int]], cost_fn) -> np.ndarray:
    """One cost per image: the image graph's cost function sees each image as a sample of its own."""
    if not units:
        return np.zeros(0)
    meta = {"image_patches": np.array([p.image_sizes[i] for p, i in units], dtype=np.int64),
            "num_tokens": np.array([p.tokens for p, _ in units], dtype=np.int64),
            "source": np.array([p.ref.source for p, _ in units], dtype=object)}
    return np.asarray(cost_fn(meta), dtype=np.float64)


def _encoder_stats(buckets: list[list[Pick]]) -> dict:
    """Without an image graph: the encoder's load per data-parallel bucket (its samples' patches)."""
    loads = np.array([float(sum(p.patches for p in g)) for g in buckets])
    return {"images": sum(len(p.image_sizes) for g in buckets for p in g), "patches": int(loads.sum()),
            "imbalance": max_over_mean(loads), "max_cost": float(loads.max()) if len(loads) else 0.0}


def _encoder_stats_arrays(patches: np.ndarray, images: np.ndarray, bin_indices: Grouping, microbatches: int) -> dict:
    """``_encoder_stats`` of the buckets the bins make, from per-sample patch and image counts."""
    bucket_of_bin = np.arange(bin_indices.count) // microbatches
    n_buckets = -(-bin_indices.count // microbatches)
    loads = np.bincount(bucket_of_bin, weights=_sums(patches.astype(np.float64), bin_indices), minlength=n_buckets)
    return {"images": int(_sums(images.astype(np.float64), bin_indices).sum()), "patches": int(loads.sum()),
            "imbalance": max_over_mean(loads), "max_cost": float(loads.max()) if len(loads) else 0.0}


def _per_bucket(bins: list[list[Pick]], microbatches: int) -> list[list[Pick]]:
    """All samples of each bucket (its microbatches' bins joined)."""
    return [sum(bins[i:i + microbatches], []) for i in range(0, len(bins), microbatches)]


def _defer(items: list[Pick], feeds, mixer: Mixer, weights, *, by_tokens: bool) -> None:
    """Samples that fit in no microbatch go back, first in line for the next step; the mixer is refunded."""
    by_source: dict[str, list[Pick]] = defaultdict(list)
    for pick in items:
        by_source[pick.ref.source].append(pick)
        mixer.refund(pick.ref.source, pick.tokens if by_tokens else 1, weights)
    for source, source_items in by_source.items():
        feeds[source].defer(source_items)


def _stats(plan: StepPlan, meta: dict[str, np.ndarray], source_index: np.ndarray, source_names: np.ndarray,
           costs: np.ndarray, bin_indices, unplaced) -> dict:
    buckets, m = plan.num_buckets, plan.microbatches
    placed = np.ones(len(costs), dtype=bool)
    placed[unplaced] = False
    bin_costs = _sums(costs, bin_indices)
    bucket_costs = bin_costs.reshape(buckets, m).sum(axis=1)
    # The same samples without balancing: contiguous equal-count chunks per bucket (np.array_split's
    # sizes), as a conventional per-rank loader would get them.
    order = np.flatnonzero(placed)
    short, extra = divmod(order.size, buckets)
    chunks = np.array([short + 1] * extra + [short] * (buckets - extra))
    unbalanced = _sums(costs, Grouping(order, np.repeat(np.arange(buckets), chunks), buckets))
    kept = source_index[placed]
    present, first = np.unique(kept, return_index=True)
    present = present[np.argsort(first)]  # first placed appearance first, as a loop would
    names = source_names[present].tolist()
    code = np.zeros(len(source_names), dtype=np.int64)
    code[present] = np.arange(len(present))
    codes = code[kept]
    samples, tokens, patches = (
        dict(zip(names, np.bincount(codes, weights=w, minlength=len(names)).astype(np.int64).tolist()))
        for w in (None, meta["num_tokens"][placed].astype(np.float64),
                  meta["image_patches"][placed].astype(np.float64)))
    return {
        "weights": plan.weights, "samples": dict(samples), "tokens": dict(tokens), "image_patches": dict(patches),
        "deferred": int(len(unplaced)),
        "imbalance": max_over_mean(bucket_costs), "imbalance_unbalanced": max_over_mean(unbalanced),
        "microbatch_imbalance": max_over_mean(bin_costs),
        "max_rank_cost": float(bucket_costs.max()), "max_rank_cost_unbalanced": float(unbalanced.max()),
        "lower_bound": float(balance.lower_bound(costs[placed], buckets)) if placed.any() else 0.0,
    }


class Grouping(NamedTuple):
    """Groups of indices laid out once for several sums over them: every member, and its group."""
    members: np.ndarray
    owner: np.ndarray
    count: int


def grouping(groups: list[np.ndarray]) -> Grouping:
    sizes = [len(g) for g in groups]
    members = np.concatenate(groups).astype(np.int64, copy=False) if sum(sizes) else np.zeros(0, dtype=np.int64)
    return Grouping(members, np.repeat(np.arange(len(groups)), sizes), len(groups))


def _sums(costs: np.ndarray, groups: "list[np.ndarray] | Grouping") -> np.ndarray:
    """The total cost of each group of indices, in one bincount rather than a numpy call per group."""
    g = groups if isinstance(groups, Grouping) else grouping(groups)
    if not g.members.size:
        return np.zeros(g.count)
    return np.bincount(g.owner, weights=costs[g.members], minlength=g.count)


def max_over_mean(x: np.ndarray) -> float:
    mean = float(np.mean(x)) if len(x) else 0.0
    return float(np.max(x) / mean) if mean > 0 else 1.0
