"""Dynamic context-parallel groups (hybrid data parallelism, ByteScale's HDP; Megatron-Core's
dynamic CP): every sample of a step gets its own CP group size, and the step's samples are placed
over the whole DP x CP domain, microbatch by microbatch. Pure numpy, no I/O.

- **Domain**: the ``D = dp * cp`` ranks that consume distinct data, numbered in mesh order (rank
  ``dp_coord * cp + cp_coord``: under Megatron's order the CP ranks of one DP group are adjacent,
  then the next DP group's). Each rank holds at most ``C = max_tokens_per_rank`` tokens per
  microbatch.
- **Group size** of a sample of ``l`` tokens: the smallest power of two ``g >= min_cp`` whose
  shard fits one rank, ``slot(l, g) / g <= C``, where the slot is ``l`` padded to a multiple of
  ``2g`` (TransformerEngine's THD layout; ``g = 1``: no padding). About ``ceil_pow2(l / C)``.
  Short samples (``g = 1``) are packed whole onto single ranks; longer ones are never truncated.
- **Group rule**: a sample on ``g`` ranks occupies the ranks ``[first, first + g)`` of one
  microbatch with ``first`` a multiple of ``g`` (aligned blocks, as in a buddy allocator): blocks
  of one size never straddle each other, and when cp is a power of two a group of at most cp
  ranks lies inside one DP group's CP ranks. Rank ``first + r`` is the sample's CP rank ``r`` and
  holds chunks ``r`` and ``2g-1-r`` of its slot (the THD split of ``core/context_parallel``).
- **Work** of a shard: ``cost(l) / g``. Under the THD split every rank of the group holds 1/g of
  the tokens and, causal attention being paired early/late, 1/g of the attention pairs, so with
  ``a*l + b*l^2`` each rank does exactly a g-th of the sample's work.
- **Widening** (``widen=True``, the default): a sample whose work on its smallest group would
  still exceed one rank's fair share of a microbatch (the step's total work / (D x microbatches))
  gets its group doubled until it does not, or the group is the whole domain: otherwise one long
  sample keeps a few ranks busy while the rest of the microbatch idles. Only such heavy (long)
  samples widen, so short ones keep paying no CP communication.
- **Placement**: samples by descending cost (ties by index), each onto the (microbatch, aligned
  group) with room for its shard on every member that raises the step time the least
  (``sum over microbatches of the slowest rank's work``), then gives the group's slowest member
  the least work in that microbatch, then over the step; ties by lowest microbatch and rank.
  Samples that fit nowhere come back unplaced (the Planner defers them to the next step).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .packing import round_up


def ceil_pow2(x) -> np.ndarray:
    """The smallest power of two >= x (1 for x <= 1), elementwise."""
    x = np.maximum(np.asarray(x, dtype=np.int64), 1)
    return np.left_shift(1, np.ceil(np.log2(x)).astype(np.int64))


def max_group(domain: int) -> int:
    """The largest group the domain has room for: the largest power of two <= ``domain``."""
    return 1 << (int(domain).bit_length() - 1)


def is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def slots(lengths, groups) -> np.ndarray:
    """Each sample's slot: its length padded to a multiple of 2g on g > 1 ranks, unpadded alone."""
    lengths, groups = np.asarray(lengths, dtype=np.int64), np.asarray(groups, dtype=np.int64)
    return np.where(groups > 1, round_up(lengths, 2 * groups), lengths)


def check_params(domain: int, capacity: int, min_cp: int) -> None:
    """Bad parameters, named."""
    if not isinstance(capacity, (int, np.integer)) or isinstance(capacity, bool) or capacity < 1:
        raise ValueError(f"HDP: max_tokens_per_rank must be an integer >= 1, got {capacity!r}")
    if not isinstance(min_cp, (int, np.integer)) or isinstance(min_cp, bool) or not is_pow2(int(min_cp)):
        raise ValueError(f"HDP: min_cp must be a power of two >= 1, got {min_cp!r}")
    if domain < 1:
        raise ValueError(f"HDP: the DP x CP domain must have at least one rank, got {domain}")
    if min_cp > max_group(domain):
        raise ValueError(f"HDP: min_cp={min_cp} is larger than the largest group of the {domain}-rank "
                         f"DP x CP domain ({max_group(domain)})")


def longest_sample(domain: int, capacity: int) -> int:
    """The longest sample the domain holds in one microbatch: the largest group's shards full."""
    g = max_group(domain)
    return g * capacity if g == 1 else (g * capacity) // (2 * g) * (2 * g)


def group_sizes(lengths, domain: int, capacity: int, min_cp: int = 1) -> np.ndarray:
    """Each sample's CP group size (module docstring); ValueError naming a sample too long for the domain."""
    check_params(domain, capacity, min_cp)
    lengths = np.asarray(lengths, dtype=np.int64)
    g = np.maximum(ceil_pow2(-(-lengths // capacity)), min_cp)
    while True:  # THD padding can push a shard over the capacity: one size up then
        over = slots(lengths, g) // g > capacity
        if not over.any():
            break
        g[over] *= 2
    too_long = np.flatnonzero(g > max_group(domain))
    if too_long.size:
        i = int(too_long[0])
        raise ValueError(f"HDP: sample {i} has {int(lengths[i])} tokens, more than the {domain}-rank DP x CP "
                         f"domain holds in one microbatch ({longest_sample(domain, capacity)} = groups of "
                         f"{max_group(domain)} x max_tokens_per_rank {capacity}, THD-padded)")
    return g


@dataclass
class HDPPlacement:
    """Where a step's samples go: ``bins[rank * microbatches + m]`` lists the samples one rank holds
    a shard of (or whole) in microbatch m, longest groups first, then by sample index."""
    bins: list[np.ndarray]
    groups: np.ndarray      # CP group size per sample
    first: np.ndarray       # first rank of its group, -1 if unplaced
    microbatch: np.ndarray  # its microbatch, -1 if unplaced
    unplaced: np.ndarray    # sample indices placed nowhere, ascending
    loads: np.ndarray       # [microbatches, domain]: work per rank per microbatch

    def step_time(self) -> float:
        """Sum over microbatches of the slowest rank's work."""
        return float(self.loads.max(axis=1).sum()) if self.loads.size else 0.0


def widen_groups(costs, groups, domain: int, microbatches: int) -> np.ndarray:
    """Groups doubled until each sample's work per rank is at most a rank's fair share of a
    microbatch, or the group is the largest the domain holds (module docstring)."""
    costs, g = np.asarray(costs, dtype=np.float64), np.array(groups, dtype=np.int64)
    share = costs.sum() / (domain * microbatches)
    while True:
        over = (costs / g > share) & (g < max_group(domain))
        if not over.any():
            return g
        g[over] *= 2


def place(costs, lengths, domain: int, microbatches: int, capacity: int, min_cp: int = 1,
          widen: bool = True) -> HDPPlacement:
    """Samples onto aligned groups of the DP x CP domain, microbatch by microbatch (module docstring)."""
    costs = np.asarray(costs, dtype=np.float64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if costs.shape != lengths.shape:
        raise ValueError(f"HDP: {len(costs)} costs for {len(lengths)} samples")
    if microbatches < 1:
        raise ValueError(f"HDP: microbatches must be >= 1, got {microbatches}")
    g = group_sizes(lengths, domain, capacity, min_cp)
    if widen and len(g):
        g = widen_groups(costs, g, domain, microbatches)
    shard = slots(lengths, g) // g
    work = costs / g
    loads = np.zeros((microbatches, domain))
    used = np.zeros((microbatches, domain), dtype=np.int64)
    first = np.full(len(costs), -1, dtype=np.int64)
    where = np.full(len(costs), -1, dtype=np.int64)
    for i in np.lexsort((np.arange(len(costs)), -costs)):
        m, f = _best(loads, used, int(g[i]), int(shard[i]), float(work[i]), capacity)
        if m < 0:
            continue
        loads[m, f:f + g[i]] += work[i]
        used[m, f:f + g[i]] += shard[i]
        first[i], where[i] = f, m
    bins = _bins(g, first, where, domain, microbatches)
    return HDPPlacement(bins, g, first, where, np.flatnonzero(first < 0), loads)


def _best(loads: np.ndarray, used: np.ndarray, g: int, shard: int, work: float, capacity: int) -> tuple[int, int]:
    """(microbatch, first rank) of the best aligned group with room, or (-1, -1)."""
    m_count, domain = loads.shape
    n = domain // g
    if g == 1:
        room = used + shard <= capacity
        group_max, step_load = loads + work, loads.sum(axis=0)[None, :]
    else:
        room = used[:, :n * g].reshape(m_count, n, g).max(axis=2) + shard <= capacity
        group_max = loads[:, :n * g].reshape(m_count, n, g).max(axis=2) + work
        step_load = loads.sum(axis=0)[:n * g].reshape(n, g).max(axis=1)[None, :]
    if not room.any():
        return -1, -1
    rise = np.maximum(group_max - loads.max(axis=1)[:, None], 0.0)
    rise[~room] = np.inf
    keys = (np.broadcast_to(step_load, rise.shape).ravel(), group_max.ravel(), rise.ravel())
    best = int(np.lexsort(keys)[0])  # lexsort is stable: ties go to the lowest (microbatch, group)
    m, group = divmod(best, n)
    return m, group * g


def _bins(groups, first, where, domain: int, microbatches: int) -> list[np.ndarray]:
    bins: list[list[int]] = [[] for _ in range(domain * microbatches)]
    for i in np.lexsort((np.arange(len(groups)), -groups)):
        if first[i] < 0:
            continue
        for rank in range(int(first[i]), int(first[i] + groups[i])):
            bins[rank * microbatches + int(where[i])].append(int(i))
    return [np.array(b, dtype=np.int64) for b in bins]


def bin_groups(bins: list[list], domain: int, microbatches: int) -> list[list[tuple[int, int]]]:
    """From bins alone (``bins[rank * microbatches + m]``, items any hashable sample id): per bin, per
    item, ``(group size, first rank)``: the ranks of the same microbatch that hold the same sample."""
    members: dict[tuple[int, object], list[int]] = {}
    for rank in range(domain):
        for m in range(microbatches):
            for item in bins[rank * microbatches + m]:
                members.setdefault((m, item), []).append(rank)
    return [[(len(members[(m, item)]), members[(m, item)][0]) for item in bins[rank * microbatches + m]]
            for rank in range(domain) for m in range(microbatches)]


def check(bins: list, unplaced, lengths, domain: int, microbatches: int, capacity: int, min_cp: int = 1) -> None:
    """An HDP placement's rules, checked from its bins alone (independently of how they were made):
    every sample placed exactly once per domain (on every rank of one aligned group, a power of two
    at least its length's group size, in one microbatch, once per rank) or listed unplaced; no
    rank's microbatch over its capacity."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if len(bins) != domain * microbatches:
        raise ValueError(f"HDP: {len(bins)} bins, expected {domain * microbatches} "
                         f"({domain} ranks x {microbatches} microbatches)")
    smallest = group_sizes(lengths, domain, capacity, min_cp)
    bins = [[int(i) for i in items] for items in bins]
    seen: dict[int, list[tuple[int, int]]] = {}
    for b, items in enumerate(bins):
        rank, m = divmod(b, microbatches)
        if len(set(items)) != len(items):
            raise ValueError(f"HDP: rank {rank} microbatch {m} holds a sample twice")
        for i in items:
            if not 0 <= i < n:
                raise ValueError(f"HDP: rank {rank} microbatch {m} names sample {i}, outside 0..{n - 1}")
            seen.setdefault(i, []).append((m, rank))
    unplaced = [int(i) for i in np.asarray(unplaced, dtype=np.int64)]
    if set(unplaced) & set(seen) or len(set(unplaced)) != len(unplaced):
        raise ValueError("HDP: a sample is both placed and unplaced, or unplaced twice")
    missing = sorted(set(range(n)) - set(seen) - set(unplaced))
    if missing:
        raise ValueError(f"HDP: sample {missing[0]} is neither placed nor unplaced")
    size = np.ones(n, dtype=np.int64)
    for i, spots in seen.items():
        ms, ranks = {m for m, _ in spots}, sorted(r for _, r in spots)
        g, start = len(ranks), ranks[0]
        if len(ms) != 1:
            raise ValueError(f"HDP: sample {i} is spread over microbatches {sorted(ms)}; a group shares one")
        if not is_pow2(g) or g < smallest[i]:
            raise ValueError(f"HDP: sample {i} ({int(lengths[i])} tokens) is on {g} ranks; its group must be a "
                             f"power of two >= {int(smallest[i])}")
        if ranks != list(range(start, start + g)) or start % g:
            raise ValueError(f"HDP: sample {i} is on ranks {ranks}: a group of {g} must be the ranks "
                             f"[k*{g}, (k+1)*{g}) of the domain")
        size[i] = g
    shard = slots(lengths, size) // size
    for b, items in enumerate(bins):
        tokens = int(shard[items].sum()) if items else 0
        if tokens > capacity:
            rank, m = divmod(b, microbatches)
            raise ValueError(f"HDP: rank {rank} microbatch {m} holds {tokens} tokens, over "
                             f"max_tokens_per_rank {capacity}")
