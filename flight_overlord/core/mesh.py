"""The trainer mesh (ClientPlaceTree): global rank <-> (pp, dp, cp, tp) coordinates.

Megatron's rank order: tp varies fastest, then cp, then dp, then pp. Ranks with the same
dp coordinate consume the same batch, so they share one Data Constructor.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import MeshConfig


@dataclass(frozen=True)
class Coord:
    pp: int
    dp: int
    cp: int
    tp: int


@dataclass(frozen=True)
class Mesh:
    pp: int = 1
    dp: int = 1
    cp: int = 1
    tp: int = 1
    dp_per_constructor: int = 1

    @classmethod
    def from_config(cls, mesh: MeshConfig, dp_per_constructor: int = 1) -> "Mesh":
        return cls(mesh.pp, mesh.dp, mesh.cp, mesh.tp, dp_per_constructor)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def num_constructors(self) -> int:
        return -(-self.dp // self.dp_per_constructor)

    def coord(self, rank: int) -> Coord:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the mesh (world size {self.world_size})")
        rest, tp = divmod(rank, self.tp)
        rest, cp = divmod(rest, self.cp)
        pp, dp = divmod(rest, self.dp)
        return Coord(pp, dp, cp, tp)

    def rank(self, coord: Coord) -> int:
        return ((coord.pp * self.dp + coord.dp) * self.cp + coord.cp) * self.tp + coord.tp

    def constructor_of(self, dp: int) -> int:
        return dp // self.dp_per_constructor

    def dp_ranks_of(self, constructor: int) -> range:
        return range(constructor * self.dp_per_constructor, min(self.dp, (constructor + 1) * self.dp_per_constructor))
