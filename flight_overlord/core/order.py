"""The read order of a source: a pure function of (seed, source, epoch).

Row groups are ordered by a seeded hash of their identity, so the global order of a
source does not depend on how many loader actors split it: an actor's own order is
just the global order restricted to the row groups it owns. Rows inside a row group
follow a permutation seeded by the same identity. With a shuffle window of K row groups
(``sources[].shuffle_window``), every K consecutive row groups of that order form a window whose
rows are drawn in one seeded permutation of them all: samples from K row groups interleave.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Iterable

import numpy as np


def stable_hash(*parts: object) -> int:
    """A 64-bit hash that is the same in every process and run (unlike ``hash()``)."""
    text = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


@dataclass(frozen=True, order=True, slots=True)  # slots: a Planner holds one per row group of the corpus
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


@dataclass(frozen=True)
class Window:
    """K consecutive row groups of an epoch's order, read as one: virtual row v is row
    ``v - offsets[j]`` of ``row_groups[j]`` for the j with offsets[j] <= v < offsets[j + 1]."""
    row_groups: tuple[RowGroupRef, ...]

    @cached_property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([rg.num_rows for rg in self.row_groups])]).astype(np.int64)

    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])

    def locate(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """(index into ``row_groups``, row within it) of each virtual row."""
        rows = np.asarray(rows, dtype=np.int64)
        which = np.searchsorted(self.offsets, rows, side="right") - 1
        return which, rows - self.offsets[which]


def windows(order: list[RowGroupRef], size: int) -> list[Window]:
    return [Window(tuple(order[i:i + size])) for i in range(0, len(order), size)]


def window_permutation(window: Window, index: int, *, seed: int, source: str, epoch: int) -> np.ndarray:
    """The order the rows of window ``index`` of an epoch are drawn in: one permutation of them all."""
    rng = np.random.default_rng(stable_hash("window", seed, source, epoch, index, len(window.row_groups)))
    return rng.permutation(window.num_rows).astype(np.int32)


class ReadOrder:
    """A source's row groups (sorted) and its seeded read order per epoch, in units of ``window`` row
    groups, with each unit's row permutation. The orders of the last ``cached`` epochs and the last few
    units' permutations are memoised: an order hashes every row group (~20 ms at 10k of them), a
    permutation is ~1 ms per 100k rows, and a replay makes a feed per re-derived step, all sharing one
    ReadOrder (consecutive steps read the same few units)."""

    def __init__(self, name: str, row_groups: Iterable[RowGroupRef], seed: int, window: int = 1, cached: int = 2):
        self.name, self.seed, self.window = name, seed, max(1, int(window))
        self.row_groups = sorted(row_groups)
        self.units = -(-len(self.row_groups) // self.window)  # row groups (or windows) per epoch
        self.rows = sum(rg.num_rows for rg in self.row_groups)
        self.epoch = lru_cache(maxsize=cached)(self._epoch)
        self.unit = lru_cache(maxsize=2 * cached)(self._unit)

    def _unit(self, epoch: int, index: int) -> tuple[RowGroupRef | Window, np.ndarray]:
        """Unit ``index`` of epoch ``epoch``'s order and the order its rows are drawn in (read-only)."""
        unit = self.epoch(epoch)[index]
        if isinstance(unit, Window):
            permutation = window_permutation(unit, index, seed=self.seed, source=self.name, epoch=epoch)
        else:
            permutation = row_permutation(unit, seed=self.seed, source=self.name, epoch=epoch)
        permutation = np.asarray(permutation)
        permutation.flags.writeable = False  # shared by every feed of the source
        return unit, permutation

    def _epoch(self, epoch: int) -> list:
        """Epoch ``epoch``'s order: row groups, or ``Window``s of them. ``epoch_order``'s, sorted by one
        array of hashes (``row_groups`` is sorted, so a stable sort breaks ties as its key does) instead of
        a key tuple per row group: at 100,000 row groups, ~10 MiB less at the peak."""
        hashes = np.fromiter((stable_hash(self.seed, self.name, epoch, rg.file, rg.row_group) for rg in self.row_groups),
                             dtype=np.uint64, count=len(self.row_groups))
        order = [self.row_groups[i] for i in np.argsort(hashes, kind="stable").tolist()]
        return order if self.window == 1 else windows(order, self.window)
