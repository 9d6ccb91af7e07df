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

Tokenize = Callable[[pa.Array, int], pa.ListArray]
_FACTORIES: dict[str, Callable[..., Tokenize]] = {}


def register_transform(name: str):
    """Decorator: make ``factory`` available to configs as ``transform: name``."""
    def decorate(factory: Callable[..., Tokenize]) -> Callable[..., Tokenize]:
        _FACTORIES[name] = factory
        return factory
    return decorate


def make_transform(name: str, options: dict | None = None) -> Tokenize:
    if name not in _FACTORIES:
        raise KeyError(f"unknown transform {name!r} (registered: {', '.join(sorted(_FACTORIES))})")
    try:
        return _FACTORIES[name](**(options or {}))
    except TypeError as exc:
        raise ValueError(f"transform {name!r}: bad options {options!r}: {exc}") from None


def _list_array(offsets: np.ndarray, values: np.ndarray) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, pa.int32()))


@register_transform("byte_tokenizer")
def byte_tokenizer() -> Tokenize:
    """UTF-8 bytes are the tokens (vocabulary 256): nothing to download, and vectorised in Arrow."""
    def tokenize(column: pa.Array, max_tokens: int) -> pa.ListArray:
        binary = pc.binary_slice(pc.fill_null(column, "").cast(pa.binary()), 0, max_tokens)
        if isinstance(binary, pa.ChunkedArray):
            binary = binary.combine_chunks()
        _, offset_buf, data = binary.buffers()
        offsets = np.frombuffer(offset_buf, dtype=np.int32)[binary.offset:binary.offset + len(binary) + 1]
        raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        return _list_array(offsets - offsets[0], raw[offsets[0]:offsets[-1]].astype(np.int32))
    return tokenize


@register_transform("hf_tokenizer")
def hf_tokenizer(path: str, add_special_tokens: bool = False) -> Tokenize:
    """A Hugging Face ``tokenizers`` JSON file (``pip install tokenizers``)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError("transform 'hf_tokenizer' needs the 'tokenizers' package: pip install tokenizers") from None
    tokenizer = Tokenizer.from_file(str(path))

    def tokenize(column: pa.Array, max_tokens: int) -> pa.ListArray:
        texts = [t or "" for t in column.to_pylist()]
        ids = [e.ids[:max_tokens] for e in tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)]
        lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.fromiter((t for seq in ids for t in seq), dtype=np.int32, count=int(offsets[-1]))
        return _list_array(offsets, values)
    return tokenize
