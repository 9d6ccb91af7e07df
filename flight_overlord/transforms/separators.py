"""Document separators for text sources: a BOS id before each document's tokens and an EOS id after
them, when the transform's options name them (``bos_token_id``, ``eos_token_id``; none by default).

Packing keeps documents apart without them (positions restart and ``cu_seqlens`` bounds each sample;
no label crosses into the next sample), so a separator only teaches the model where a document starts
or ends. The EOS goes in only when the document and its separators fit in ``max_tokens``: a document
cut at the context length did not end there.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa

Tokenize = Callable[[pa.Array, int], pa.ListArray]


def with_separators(tokenize: Tokenize, bos: int | None, eos: int | None) -> Tokenize:
    for name, value in (("bos_token_id", bos), ("eos_token_id", eos)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name}: expected a token id (an integer >= 0), got {value!r}")
    if bos is None and eos is None:
        return tokenize

    def separated(column: pa.Array, max_tokens: int) -> pa.ListArray:
        return add_separators(tokenize(column, max_tokens), bos, eos, max_tokens)
    return separated


def add_separators(tokens: pa.ListArray, bos: int | None, eos: int | None, max_tokens: int) -> pa.ListArray:
    """``[bos] + ids + [eos]`` per row, cut to ``max_tokens`` (whole-array numpy: this runs per row group)."""
    offsets = tokens.offsets.to_numpy().astype(np.int64)
    ids = tokens.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
    lengths = np.diff(offsets)
    head = 0 if bos is None else 1
    out_lengths = np.minimum(lengths + head + (eos is not None), max_tokens)
    out_offsets = np.concatenate([[0], np.cumsum(out_lengths)])
    out = np.empty(int(out_offsets[-1]), dtype=np.int32)
    within = np.arange(len(ids)) - np.repeat(offsets[:-1] - offsets[0], lengths)
    kept = within < np.repeat(out_lengths - head, lengths)
    out[(np.repeat(out_offsets[:-1] + head, lengths) + within)[kept]] = ids[kept]
    if bos is not None:
        out[out_offsets[:-1][out_lengths > 0]] = bos
    if eos is not None:
        room = head + lengths < out_lengths
        out[(out_offsets[:-1] + head + lengths)[room]] = eos
    return pa.ListArray.from_arrays(pa.array(out_offsets.astype(np.int32)), pa.array(out))
