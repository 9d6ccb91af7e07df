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
from typing import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .file_ids import FileIds


def stable_hash(*parts: object) -> int:
    """A 64-bit hash that is the same in every process and run (unlike ``hash()``)."""
    text = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


@dataclass(frozen=True, order=True, slots=True)  # slots: a Planner holds one per row group of the corpus
class RowGroupRef:
    file: str  # file id (path relative to the data root)
    row_group: int
    num_rows: int


class RowGroups(Sequence[RowGroupRef]):
    """Row groups sorted by (file id, row group), as columns: the file ids once per file (compressed:
    ``FileIds``) and, per row group, its file's index, its index in the file and its rows (int32 each).
    A Planner holds a corpus's: as ``RowGroupRef`` objects with a Python string per file they cost ~130
    bytes per row group, as columns ~13. A ``RowGroupRef`` is made when an item is read."""

    __slots__ = ("file_ids", "file", "row_group", "num_rows")

    def __init__(self, file_ids: FileIds | pa.Array | Sequence[str], file: np.ndarray, row_group: np.ndarray,
                 num_rows: np.ndarray):
        """``file_ids`` sorted and distinct; ``file`` (indices into it) and ``row_group`` sorted as pairs."""
        if not isinstance(file_ids, FileIds):
            file_ids = FileIds(file_ids if isinstance(file_ids, pa.Array) else pa.array(list(file_ids), pa.string()))
        self.file_ids = file_ids
        self.file = np.asarray(file, np.int32)
        self.row_group = np.asarray(row_group, np.int32)
        self.num_rows = np.asarray(num_rows, np.int32)

    @classmethod
    def of(cls, refs: Iterable[RowGroupRef]) -> "RowGroups":
        """``refs`` (any order, no two alike) as columns."""
        if isinstance(refs, RowGroups):
            return refs
        refs = sorted(refs)
        ids = sorted({rg.file for rg in refs})
        index = {f: i for i, f in enumerate(ids)}
        return cls(ids, np.array([index[rg.file] for rg in refs], np.int32),
                   np.array([rg.row_group for rg in refs], np.int32), np.array([rg.num_rows for rg in refs], np.int32))

    @classmethod
    def of_files(cls, file_ids: pa.Array, offsets: np.ndarray, rows: np.ndarray) -> "RowGroups":
        """Every chunk of files whose chunks' rows are ``rows[offsets[i]:offsets[i + 1]]`` for file i."""
        offsets = np.asarray(offsets, np.int64)
        counts = np.diff(offsets)
        file = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        row_group = np.arange(len(file), dtype=np.int64) - np.repeat(offsets[:-1], counts)
        if len(file_ids) < 2 or pc.all(pc.less(file_ids[:-1], file_ids[1:])).as_py():  # a config's files come sorted
            return cls(file_ids, file, row_group, rows)
        order = np.asarray(pc.sort_indices(file_ids))
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        by_file = np.lexsort((row_group, rank[file]))
        return cls(file_ids.take(pa.array(order)), rank[file][by_file], row_group[by_file], np.asarray(rows)[by_file])

    def __len__(self) -> int:
        return len(self.file)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        return RowGroupRef(self.file_ids[int(self.file[i])], int(self.row_group[i]), int(self.num_rows[i]))

    def __iter__(self) -> Iterator[RowGroupRef]:
        for (file, g), n in zip(self._pairs(), self.num_rows.tolist()):
            yield RowGroupRef(file, g, n)

    def __eq__(self, other) -> bool:
        if isinstance(other, RowGroups):
            return (np.array_equal(self.row_group, other.row_group) and np.array_equal(self.num_rows, other.num_rows)
                    and self.file_names() == other.file_names())
        return isinstance(other, (list, tuple)) and list(self) == list(other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"RowGroups({len(self)} row groups of {len(self.file_ids)} files)"

    def file_names(self) -> list[str]:
        """The file id of every row group."""
        return [file for file, _ in self._pairs()]

    @property
    def total_rows(self) -> int:
        return int(self.num_rows.sum(dtype=np.int64))

    def take(self, positions) -> "RowGroups":
        """The row groups at ``positions`` (increasing), the file ids shared."""
        return RowGroups(self.file_ids, self.file[positions], self.row_group[positions], self.num_rows[positions])

    def index(self, file: str, row_group: int) -> int:
        """The position of row group ``row_group`` of ``file``; KeyError when it is not here."""
        try:
            f = self.file_ids.index(file)
        except KeyError:
            raise KeyError((file, row_group)) from None
        lo, hi = np.searchsorted(self.file, [f, f + 1])
        i = lo + int(np.searchsorted(self.row_group[lo:hi], row_group))
        if i < hi and self.row_group[i] == row_group:
            return int(i)
        raise KeyError((file, row_group))

    def hashes(self, *prefix: object) -> np.ndarray:
        """``stable_hash(*prefix, file, row_group)`` of every row group (uint64)."""
        hashes = (stable_hash(*prefix, file, g) for file, g in self._pairs())
        return np.fromiter(hashes, dtype=np.uint64, count=len(self))

    def epoch_order(self, seed: int, source: str, epoch: int) -> np.ndarray:
        """:func:`epoch_order`'s order as indices into these row groups (int32): sorted by one array of
        hashes, ties broken stably, so by these row groups' own (sorted) order, as that key does."""
        return np.argsort(self.hashes(seed, source, epoch), kind="stable").astype(np.int32)

    def _pairs(self) -> Iterator[tuple[str, int]]:
        """(file id, row group) of every row group, the ids made as Python strings a block of files at a
        time: made all at once they would leave the allocator holding a corpus-sized heap."""
        file, row_group = self.file, self.row_group
        for lo, ids in self.file_ids.batches():
            first, last = np.searchsorted(file, [lo, lo + len(ids)])
            for f, g in zip(file[first:last].tolist(), row_group[first:last].tolist()):
                yield ids[f - lo], g


@dataclass(frozen=True)
class SampleRef:
    """One sample occurrence: which epoch of which row of which row group of a source."""
    source: str
    epoch: int
    file: str
    row_group: int
    row: int

    @cached_property  # asked for several times per sample and step (plan record, constructor plans)
    def key(self) -> str:
        return sample_key(self.source, self.file, self.row_group, self.row)


def sample_key(source: str, file: str, row_group: int, row: int) -> str:
    return f"{source}:{file}:{row_group}:{row}"


def owned_row_groups(catalog: Iterable[RowGroupRef], actor: int, num_actors: int) -> list[RowGroupRef] | RowGroups:
    """Actor ``actor`` of ``num_actors`` owns every num_actors-th row group of the sorted catalog."""
    if isinstance(catalog, RowGroups):
        return catalog.take(np.arange(actor, len(catalog), num_actors))
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


def window_permutation(window: Window, index: int, *, seed: int, source: str, epoch: int) -> np.ndarray:
    """The order the rows of window ``index`` of an epoch are drawn in: one permutation of them all."""
    rng = np.random.default_rng(stable_hash("window", seed, source, epoch, index, len(window.row_groups)))
    return rng.permutation(window.num_rows).astype(np.int32)


class ReadOrder:
    """A source's row groups (sorted, as ``RowGroups``) and its seeded read order per epoch, in units of
    ``window`` row groups, with each unit's row permutation. The orders of the last ``cached`` epochs (as
    positions into ``row_groups``) and the last few units' permutations are memoised: an order hashes every
    row group (~20 ms at 10k of them), a permutation is ~1 ms per 100k rows, and a replay makes a feed per
    re-derived step, all sharing one ReadOrder (consecutive steps read the same few units)."""

    def __init__(self, name: str, row_groups: Iterable[RowGroupRef], seed: int, window: int = 1, cached: int = 2):
        self.name, self.seed, self.window = name, seed, max(1, int(window))
        self.row_groups = RowGroups.of(row_groups)
        self.units = -(-len(self.row_groups) // self.window)  # row groups (or windows) per epoch
        self.rows = self.row_groups.total_rows
        self.epoch = lru_cache(maxsize=cached)(self._epoch)
        self.unit = lru_cache(maxsize=2 * cached)(self._unit)

    def _unit(self, epoch: int, index: int) -> tuple[RowGroupRef | Window, np.ndarray]:
        """Unit ``index`` of epoch ``epoch``'s order and the order its rows are drawn in (read-only)."""
        positions = self.epoch(epoch)[index * self.window:(index + 1) * self.window].tolist()
        if self.window == 1:
            unit = self.row_groups[positions[0]]
            permutation = row_permutation(unit, seed=self.seed, source=self.name, epoch=epoch)
        else:
            unit = Window(tuple(self.row_groups[p] for p in positions))
            permutation = window_permutation(unit, index, seed=self.seed, source=self.name, epoch=epoch)
        permutation = np.asarray(permutation)
        permutation.flags.writeable = False  # shared by every feed of the source
        return unit, permutation

    def _epoch(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s order as positions into ``row_groups`` (int32, read-only): ``epoch_order``'s
        (``RowGroups.epoch_order``); unit i is positions ``[i * window, (i + 1) * window)``."""
        order = self.row_groups.epoch_order(self.seed, self.name, epoch)
        order.flags.writeable = False
        return order
