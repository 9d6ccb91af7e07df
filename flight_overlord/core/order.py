"""The read order of a source: a pure function of (seed, source, epoch).

Row groups are ordered by a seeded hash of their identity, so the global order of a
source does not depend on how many loader actors split it: an actor's own order is
just the global order restricted to the row groups it owns. Rows inside a row group
follow a permutation seeded by the same identity.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable

import numpy as np


def stable_hash(*parts: object) -> int:
    """A 64-bit hash that is the same in every process and run (unlike ``hash()``)."""
    text = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


@dataclass(frozen=True, order=True)
class RowGroupRef:
    file: str  # file id (path relative to the data root)
    row_group: int
    num_rows: int


@dataclass(frozen=True)
class SampleRef:
    """One sample occurrence: which epoch of which row of which row group of a source."""
    source: str
    epoch: int
    file: str
    row_group: int
    row: int

    @cached_property  # asked for several times per sample and step (plan record, constructor views)
    def key(self) -> str:
        return sample_key(self.source, self.file, self.row_group, self.row)


def sample_key(source: str, file: str, row_group: int, row: int) -> str:
    return f"{source}:{file}:{row_group}:{row}"


def owned_row_groups(catalog: list[RowGroupRef], actor: int, num_actors: int) -> list[RowGroupRef]:
    """Actor ``actor`` of ``num_actors`` owns every num_actors-th row group of the sorted catalog."""
    return [rg for i, rg in enumerate(sorted(catalog)) if i % num_actors == actor]


def epoch_order(row_groups: Iterable[RowGroupRef], *, seed: int, source: str, epoch: int) -> list[RowGroupRef]:
    return sorted(row_groups, key=lambda rg: (stable_hash(seed, source, epoch, rg.file, rg.row_group), rg))


def row_permutation(rg: RowGroupRef, *, seed: int, source: str, epoch: int) -> np.ndarray:
    rng = np.random.default_rng(stable_hash("rows", seed, source, epoch, rg.file, rg.row_group))
    return rng.permutation(rg.num_rows).astype(np.int32)
