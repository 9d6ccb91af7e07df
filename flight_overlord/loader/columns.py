"""What a source needs of its files' schema: its columns, with types it can read.

Checked on every file's schema as the loader catalogs it, and on one file per source before any
role starts (``deploy/precheck.py``): the error is one line naming the source, the file and the column.
"""
from __future__ import annotations

import pyarrow as pa

from ..config import ConfigError, SourceConfig


def is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _integer_list(t: pa.DataType) -> bool:
    return is_list(t) and pa.types.is_integer(t.value_type)


def _mask_list(t: pa.DataType) -> bool:
    return is_list(t) and (pa.types.is_integer(t.value_type) or pa.types.is_boolean(t.value_type))


def wanted_columns(source: SourceConfig) -> dict[str, tuple[str, object]]:
    """column -> (the type it must have, as said in errors; the test of a type)."""
    if source.tokens_column:
        wanted = {source.tokens_column: ("a list of integer token ids", _integer_list)}
        if source.loss_mask_column:
            wanted[source.loss_mask_column] = ("a list of 0/1 integers or booleans per token", _mask_list)
        return wanted
    if source.image_column:
        return {source.text_column: ("list<string>", lambda t: is_list(t) and is_text(t.value_type)),
                source.image_column: ("list<binary>", lambda t: is_list(t) and is_text(t.value_type))}
    return {source.text_column: ("string", is_text)}


def check_columns(source: SourceConfig, path: str, schema: pa.Schema) -> None:
    """The source's columns exist in ``schema`` (of file ``path``, as shown) with types it can read."""
    for column, (kind, fits) in wanted_columns(source).items():
        if column not in schema.names:
            raise ConfigError(f"source {source.name!r}: file {path} has no column {column!r} "
                              f"(columns: {', '.join(schema.names)})")
        t = schema.field(column).type
        if not fits(t):
            raise ConfigError(f"source {source.name!r}: column {column!r} of file {path} is {t}, expected {kind}")
