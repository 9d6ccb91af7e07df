"""Pre-tokenized sources (``tokens_column``): a column of token id lists is the tokens, no tokenizer.

Any integer list type is taken (list, large_list or fixed_size_list of int8..int64 or uint8..uint64);
ids must be in [0, 2^31) (the wire's int32). A null list is an empty sample. An optional per-token
loss-mask column (``loss_mask_column``, supervised fine-tuning) must hold as many values as the
tokens, row by row; it is cut where the tokens are.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

INT32_MAX = 2**31 - 1


def _sliced(column: pa.Array, max_tokens: int) -> tuple[np.ndarray, pa.Array]:
    """(lengths per row, flattened values) of the lists cut to ``max_tokens``; a null list is empty."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_fixed_size_list(column.type):  # sliced, it would be padded with nulls to its size
        column = column.cast(pa.list_(column.type.value_type))
    cut = pc.list_slice(column, 0, max_tokens)
    return _lengths(cut).astype(np.int32), pc.list_flatten(cut)


def token_lists(column: pa.Array, max_tokens: int, name: str) -> pa.ListArray:
    """int32 token lists, one per row, at most ``max_tokens`` each; a ValueError names ``name`` when an
    id is null, negative or past int32."""
    lengths, values = _sliced(column, max_tokens)
    if values.null_count:
        raise ValueError(f"column {name!r}: a null token id")
    if len(values):
        low, high = pc.min_max(values).values()
        if low.as_py() < 0 or high.as_py() > INT32_MAX:
            raise ValueError(f"column {name!r}: token ids must be in [0, {INT32_MAX}], found "
                             f"{low.as_py() if low.as_py() < 0 else high.as_py()}")
    return _lists(lengths, values.cast(pa.int32()))


def loss_masks(column: pa.Array, tokens: pa.Array, max_tokens: int, name: str) -> pa.ListArray:
    """uint8 0/1 lists, one per row, cut like the tokens; a ValueError names the first row whose mask
    is not as long as its tokens."""
    mask_lengths, token_lengths = _lengths(column), _lengths(tokens)
    wrong = np.flatnonzero(mask_lengths != token_lengths)
    if wrong.size:
        row = int(wrong[0])
        raise ValueError(f"column {name!r}: row {row} has {mask_lengths[row]} loss-mask values for "
                         f"{token_lengths[row]} tokens")
    lengths, values = _sliced(column, max_tokens)
    if values.null_count:
        raise ValueError(f"column {name!r}: a null loss-mask value")
    return _lists(lengths, pc.not_equal(values.cast(pa.int64()), 0).cast(pa.uint8()))


def _lengths(column: pa.Array) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)


def _lists(lengths: np.ndarray, values: pa.Array) -> pa.ListArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), values)
