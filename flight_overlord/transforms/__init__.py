"""Sample transforms, run at the Source Loader on whole row groups.

A transform is registered under a name by a *factory*: ``factory(**options)`` returns
a function ``(column: pa.Array, max_tokens: int) -> pa.ListArray`` of int32 token ids,
one list per row. Factories run once per loader, so they may load a tokenizer file.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..core.registry import Registry
from .separators import with_separators

Tokenize = Callable[[pa.Array, int], pa.ListArray]
TRANSFORMS: Registry = Registry("transform")


def register_transform(name: str):
    """Decorator: make ``factory`` available to configs as ``transform: name``."""
    return TRANSFORMS.register(name)


def make_transform(name: str, options: dict | None = None) -> Tokenize:
    factory = TRANSFORMS[name]
    try:
        return factory(**(options or {}))
    except TypeError as exc:
        raise ValueError(f"transform {name!r}: bad options {options!r}: {exc}") from None


def _list_array(offsets: np.ndarray, values: np.ndarray) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, pa.int32()))


@register_transform("byte_tokenizer")
def byte_tokenizer(bos_token_id: int | None = None, eos_token_id: int | None = None) -> Tokenize:
    """UTF-8 bytes are the tokens (vocabulary 256): nothing to download, and vectorised in Arrow.
    ``bos_token_id`` / ``eos_token_id``: document separators (``separators.py``), none by default."""
    def tokenize(column: pa.Array, max_tokens: int) -> pa.ListArray:
        binary = pc.binary_slice(pc.fill_null(column, "").cast(pa.binary()), 0, max_tokens)
        if isinstance(binary, pa.ChunkedArray):
            binary = binary.combine_chunks()
        _, offset_buf, data = binary.buffers()
        offsets = np.frombuffer(offset_buf, dtype=np.int32)[binary.offset:binary.offset + len(binary) + 1]
        raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        return _list_array(offsets - offsets[0], raw[offsets[0]:offsets[-1]].astype(np.int32))
    return with_separators(tokenize, bos_token_id, eos_token_id)


@register_transform("hf_tokenizer")
def hf_tokenizer(path: str, add_special_tokens: bool = False, bos_token_id: int | None = None,
                 eos_token_id: int | None = None) -> Tokenize:
    """A Hugging Face ``tokenizers`` JSON file (``pip install tokenizers``), e.g. the byte-level BPE
    ``overlord make-demo-data`` writes as ``tokenizer.json``.

    ``path`` is taken as given: configs resolve a relative one against ``data_root``. Null texts
    give empty token lists (as for ``byte_tokenizer``). ``add_special_tokens``: the tokenizer's own
    template (its post-processor: a BOS for some, nothing for many); ``bos_token_id`` /
    ``eos_token_id``: separators added here (``separators.py``). The whole row group is encoded with one
    ``encode_batch`` call (in parallel, in Rust); the token lists then go to Arrow in one
    conversion, truncated to ``max_tokens``.
    """
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError("transform 'hf_tokenizer' needs the 'tokenizers' package: "
                         "pip install tokenizers (or the project's 'tokenizers' extra)") from None
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for a missing or malformed file
        raise ValueError(f"transform 'hf_tokenizer': cannot load tokenizer file {str(path)!r}: {exc}") from None
    # encode_batch_fast (tokenizers >= 0.20) skips the character offsets nobody here reads.
    encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)

    def tokenize(column: pa.Array, max_tokens: int) -> pa.ListArray:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if not pa.types.is_string(column.type):
            column = column.cast(pa.string())  # large_string/string_view; binary must be valid UTF-8
        texts = pc.fill_null(column, "").to_pylist()
        encodings = encode_batch(texts, add_special_tokens=add_special_tokens)
        return pa.array([e.ids[:max_tokens] for e in encodings], _TOKEN_LISTS)
    return with_separators(tokenize, bos_token_id, eos_token_id)


_TOKEN_LISTS = pa.list_(pa.int32())
