"""A corpus's file ids, sorted, held compressed: the Planner keeps one per file of every source, and
100,000 ids of ~25 characters cost ~2.6 MiB as Arrow strings (more as Python strings), against ~0.1 MiB
as zstd blocks of ``BLOCK`` ids. An id is read by decoding its block (~15 us for 256 ids); the last
``DECODED`` blocks stay decoded, as a step's picks and owners come from a few files at a time."""
from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from typing import Iterator

import pyarrow as pa

BLOCK = 256
DECODED = 4
CODEC = "zstd"
SEPARATOR = "\0"  # no path holds it


class FileIds:
    """Sorted, distinct strings, compressed in blocks; indexable and searchable like a sorted list."""

    def __init__(self, ids: pa.Array):
        """``ids``: Arrow strings, sorted and distinct."""
        self._count = len(ids)
        self._firsts: list[str] = []  # each block's first id: which block holds a name
        self._blocks: list[tuple[bytes, int]] = []  # (compressed, size decoded)
        for lo in range(0, self._count, BLOCK):
            names = ids.slice(lo, BLOCK).to_pylist()
            data = SEPARATOR.join(names).encode()
            self._firsts.append(names[0])
            self._blocks.append((pa.compress(data, codec=CODEC, asbytes=True), len(data)))
        self._decoded: OrderedDict[int, list[str]] = OrderedDict()
        self._lock = threading.Lock()  # owners are asked on several server threads

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i: int) -> str:
        if not -self._count <= i < self._count:
            raise IndexError(f"file {i} of {self._count}")
        block, offset = divmod(i % self._count, BLOCK)
        return self._block(block)[offset]

    def index(self, name: str) -> int:
        """The position of ``name``; KeyError when it is not here."""
        block = bisect_right(self._firsts, name) - 1
        if block >= 0:
            names = self._block(block)
            i = bisect_left(names, name)
            if i < len(names) and names[i] == name:
                return block * BLOCK + i
        raise KeyError(name)

    def batches(self) -> Iterator[tuple[int, list[str]]]:
        """(position of the first, ids) of each block in turn, decoded once and not kept."""
        for block in range(len(self._blocks)):
            yield block * BLOCK, self._decode(block)

    def to_pylist(self) -> list[str]:
        return [name for _, names in self.batches() for name in names]

    def __eq__(self, other) -> bool:
        return isinstance(other, FileIds) and self._blocks == other._blocks

    __hash__ = None

    def _block(self, block: int) -> list[str]:
        with self._lock:
            names = self._decoded.get(block)
            if names is not None:
                self._decoded.move_to_end(block)
                return names
        names = self._decode(block)
        with self._lock:
            self._decoded[block] = names
            while len(self._decoded) > DECODED:
                self._decoded.popitem(last=False)
        return names

    def _decode(self, block: int) -> list[str]:
        data, size = self._blocks[block]
        return pa.decompress(data, decompressed_size=size, codec=CODEC, asbytes=True).decode().split(SEPARATOR)
