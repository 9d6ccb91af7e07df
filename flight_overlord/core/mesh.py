"""The trainer mesh (ClientPlaceTree): global rank <-> (pp, dp, cp, tp) coordinates, and what each
rank receives.

Rank order is Megatron's by default: tp varies fastest, then cp, then dp, then pp (``order`` lists
the axes fastest first and may be changed). Ranks with the same dp coordinate consume the same
batch, so they share one Data Constructor.

Where the data goes follows from the tree and the strategy (``distribute`` and ``broadcast_at``):

- a *bucket* is one consumer of distinct data: a dp coordinate (axis ``DP``), a (dp, cp) pair
  (axis ``CP``: DP x CP ranks as uniform consumers; ``HDP`` too, each sample on a CP group of
  its own, :mod:`.hdp`) or a single rank (axis ``WORLD``);
- under ``DP`` with cp > 1 each packed sequence is split across the CP ranks
  (:mod:`.context_parallel`);
- each pipeline stage gets the token fields it needs (:mod:`.stages`: by default tokens and
  positions to the first, labels and loss mask to the last); ranks behind a ``broadcast_at``
  dimension get metadata only (shapes, cu_seqlens, keys), not tokens.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from .stages import ALL_FIELDS, StageContents

AXES = ("pp", "dp", "cp", "tp")
MEGATRON_ORDER = ("tp", "cp", "dp", "pp")  # fastest-varying first
DISTRIBUTE_AXES = ("DP", "CP", "WORLD", "HDP")
BROADCAST_DIMS = ("TP", "CP")


@dataclass(frozen=True)
class Coord:
    pp: int
    dp: int
    cp: int
    tp: int


@dataclass(frozen=True)
class Delivery:
    """What one rank receives of a step: its bucket's rows, which CP chunk, and which token fields."""
    bucket: int
    cp_rank: int | None  # the chunk of each sequence this rank holds; None: the whole sequence
    fields: frozenset[str] = ALL_FIELDS  # token fields (core/stages.py); empty: metadata only

    @property
    def tokens(self) -> bool:
        """Whether the rank holds positions of the sequence at all (else metadata only)."""
        return bool(self.fields)

    @property
    def key(self) -> tuple:
        return (self.bucket, -1 if self.cp_rank is None else self.cp_rank, tuple(sorted(self.fields)))


@dataclass(frozen=True)
class Mesh:
    """The trainers' mesh: the config's ``mesh`` section (sizes, rank order, how CP splits a
    sequence) with ``constructor.dp_per_constructor``; the one mesh type of the package."""
    pp: int = 1
    dp: int = 1
    cp: int = 1
    tp: int = 1
    dp_per_constructor: int = 1
    order: tuple[str, ...] = MEGATRON_ORDER  # rank order, fastest-varying axis first
    cp_split: str = "load_balanced"  # bshd: how the buffer is split across CP ranks: load_balanced | contiguous
    cp_format: str = "thd"  # thd: each packed sequence padded to 2*cp and split on its own (TransformerEngine)

    def __post_init__(self):
        if sorted(self.order) != sorted(AXES):
            raise ValueError(f"mesh order {self.order!r} must name each of {', '.join(AXES)} once")

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def num_constructors(self) -> int:
        return -(-self.dp // self.dp_per_constructor)

    def size(self, axis: str) -> int:
        return getattr(self, axis)

    def coord(self, rank: int) -> Coord:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the mesh (world size {self.world_size})")
        values = {}
        for axis in self.order:
            rank, values[axis] = divmod(rank, self.size(axis))
        return Coord(**values)

    def rank(self, coord: Coord) -> int:
        rank = 0
        for axis in reversed(self.order):
            rank = rank * self.size(axis) + getattr(coord, axis)
        return rank

    def constructor_of(self, dp: int) -> int:
        return dp // self.dp_per_constructor

    def dp_ranks_of(self, constructor: int) -> range:
        return range(constructor * self.dp_per_constructor, min(self.dp, (constructor + 1) * self.dp_per_constructor))

    # -- buckets: the consumers of distinct data under a distribution axis ----------------
    def num_buckets(self, axis: str) -> int:
        return {"DP": self.dp, "CP": self.dp * self.cp, "HDP": self.dp * self.cp,
                "WORLD": self.world_size}[_check_axis(axis)]

    def bucket_of(self, rank: int, axis: str) -> int:
        c = self.coord(rank)
        return {"DP": c.dp, "CP": c.dp * self.cp + c.cp, "HDP": c.dp * self.cp + c.cp, "WORLD": rank}[_check_axis(axis)]

    def dp_of_bucket(self, bucket: int, axis: str) -> int:
        """The dp coordinate of a bucket's ranks: it decides which constructor assembles the bucket."""
        if _check_axis(axis) == "DP":
            return bucket
        if axis in ("CP", "HDP"):
            return bucket // self.cp
        return self.coord(bucket).dp

    @functools.cache  # asked per step and constructor; a mesh is immutable
    def buckets_of_constructor(self, constructor: int, axis: str) -> tuple[int, ...]:
        dps = set(self.dp_ranks_of(constructor))
        return tuple(b for b in range(self.num_buckets(axis)) if self.dp_of_bucket(b, axis) in dps)

    @functools.cache
    def replica_group(self, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s data-parallel index (all of its pp, cp, tp): one replica group, as
        torchft restarts and heals it."""
        dp = self.coord(rank).dp
        return tuple(r for r in range(self.world_size) if self.coord(r).dp == dp)

    @functools.cache
    def ranks_of_constructor(self, constructor: int) -> tuple[int, ...]:
        """Every rank (all of pp, cp, tp) whose data-parallel group constructor ``constructor`` serves."""
        dps = set(self.dp_ranks_of(constructor))
        return tuple(r for r in range(self.world_size) if self.coord(r).dp in dps)

    def reads(self, rank: int, silent: frozenset[str]) -> bool:
        """Whether a rank reads its stream: not when it is above 0 along a broadcast dimension whose
        other ranks never read (``broadcast_at(dim, others_read=False)``: Megatron's TP rank 0 reads
        and broadcasts, the others never call ``next()``)."""
        c = self.coord(rank)
        return not any(getattr(c, dim.lower()) > 0 for dim in silent)

    def delivery(self, rank: int, axis: str = "DP", broadcast: frozenset[str] = frozenset(),
                 stages: StageContents = StageContents()) -> Delivery:
        """The ClientPlaceTree's rule for one rank; ``stages``: the token fields per pipeline stage."""
        c = self.coord(rank)
        bucket = self.bucket_of(rank, axis)
        if axis == "WORLD":
            return Delivery(bucket, None, ALL_FIELDS)  # every rank is its own consumer
        receiver = not ("TP" in broadcast and c.tp > 0) and not ("CP" in broadcast and c.cp > 0)
        split = axis == "DP" and self.cp > 1 and "CP" not in broadcast
        return Delivery(bucket, c.cp if split else None, stages.fields(c.pp, self.pp) if receiver else frozenset())


def _check_axis(axis: str) -> str:
    if axis not in DISTRIBUTE_AXES:
        raise ValueError(f"unknown distribution axis {axis!r} (axes: {', '.join(DISTRIBUTE_AXES)})")
    return axis
