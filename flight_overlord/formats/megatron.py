"""Megatron-LM indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``, the ``MMIDIDX`` layout of
``megatron/core/datasets/indexed_dataset.py``), read in place as a pre-tokenized source.

The ``.idx`` holds: the 9-byte magic, version (u64, 1), the token dtype's code (u8), the sequence and
document counts (u64 each), then per sequence its length (int32) and byte offset in ``.bin`` (int64),
then the document index (int64). A row is a sequence, its tokens the one column ``input_ids``
(name it with ``tokens_column: input_ids``). A chunk is a run of consecutive sequences of about
``CHUNK_BYTES`` of tokens (a function of the index alone, so sample keys are stable); the ``.bin`` is
memory-mapped, a chunk is a view of it. Local files only (``np.memmap``).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from .base import ChunkFile

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}  # integer codes only
CHUNK_BYTES = 1 << 20
COLUMN = "input_ids"


class MegatronIndexed(ChunkFile):
    def __init__(self, bin_path: str):
        if not bin_path.endswith(".bin"):
            raise ValueError("name the .bin file of a Megatron indexed dataset (its .idx beside it)")
        self.sizes, self.pointers, self.dtype = read_index(bin_path[:-4] + ".idx")
        self.tokens = np.memmap(bin_path, dtype=np.uint8, mode="r")
        itemsize = np.dtype(self.dtype).itemsize
        ends = self.pointers + self.sizes.astype(np.int64) * itemsize
        if len(ends) and ends.max() > len(self.tokens):
            raise ValueError(f"the index points past the end of the .bin ({ends.max()} > {len(self.tokens)} bytes)")
        starts = np.cumsum(self.sizes.astype(np.int64) * itemsize) - self.sizes.astype(np.int64) * itemsize
        first = np.flatnonzero(np.diff(starts // CHUNK_BYTES, prepend=-1)) if len(starts) else np.zeros(0, np.int64)
        self.bounds = np.append(first, len(self.sizes)).astype(np.int64)  # chunk c: sequences [bounds[c], bounds[c+1])
        self.schema = pa.schema([(COLUMN, pa.list_(pa.from_numpy_dtype(self.dtype)))])

    @property
    def num_chunks(self) -> int:
        return len(self.bounds) - 1

    def chunk_rows(self, chunk: int) -> int:
        return int(self.bounds[chunk + 1] - self.bounds[chunk])

    def chunk_bytes(self, chunk: int, columns: list[str] | None = None) -> int:
        a, b = self.bounds[chunk], self.bounds[chunk + 1]
        return int(self.sizes[a:b].astype(np.int64).sum()) * np.dtype(self.dtype).itemsize

    @property
    def index_bytes(self) -> int:
        return self.sizes.nbytes + self.pointers.nbytes + self.bounds.nbytes

    def read(self, chunk: int, columns: list[str]) -> pa.Table:
        a, b = int(self.bounds[chunk]), int(self.bounds[chunk + 1])
        sizes = self.sizes[a:b].astype(np.int64)
        itemsize = np.dtype(self.dtype).itemsize
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        if np.array_equal(self.pointers[a:b], self.pointers[a] + offsets[:-1] * itemsize):  # back to back: one view
            start = int(self.pointers[a]) if b > a else 0
            values = self.tokens[start:start + int(offsets[-1]) * itemsize].view(self.dtype)
        else:
            values = np.concatenate([self.tokens[p:p + n * itemsize].view(self.dtype)
                                     for p, n in zip(self.pointers[a:b], sizes)])
        lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
        return pa.table({COLUMN: lists}, schema=self.schema).select(columns)

    def close(self) -> None:
        self.tokens = None


def read_index(path: str) -> tuple[np.ndarray, np.ndarray, type]:
    """(sequence lengths, byte offsets, token dtype) of a ``.idx`` file; a ValueError says what is wrong."""
    with open(path, "rb") as f:
        head = f.read(9 + 8 + 1 + 8 + 8)
        if len(head) < 34 or head[:9] != MAGIC:
            raise ValueError(f"{path}: not a Megatron index (no {MAGIC!r} header)")
        version, code = int.from_bytes(head[9:17], "little"), head[17]
        sequences = int.from_bytes(head[18:26], "little")
        if version != 1:
            raise ValueError(f"{path}: index version {version}, only 1 is known")
        if code not in DTYPES:
            raise ValueError(f"{path}: token dtype code {code} is not an integer type (known: {sorted(DTYPES)})")
        sizes = np.fromfile(f, dtype="<i4", count=sequences)
        pointers = np.fromfile(f, dtype="<i8", count=sequences)
    if len(pointers) != sequences:
        raise ValueError(f"{path}: truncated ({sequences} sequences announced)")
    return sizes, pointers, DTYPES[code]
