"""What a source needs of its files' schema (``loader/columns.py``): the columns its kind reads, with
types it can read; anything else is one ConfigError naming the source, the file and the column."""
from __future__ import annotations

import pyarrow as pa
import pytest

from flight_overlord.config import ConfigError, parse_config
from flight_overlord.loader.columns import check_columns, wanted_columns


def _source(tmp_path, **keys):
    (tmp_path / "f.parquet").write_bytes(b"")  # the config only checks that the file exists
    cfg = parse_config({"run_dir": str(tmp_path / "run"), "sources": [{"name": "s", "paths": "f.parquet", **keys}],
                        "global_batch": {"context_length": 64, "microbatches": 1, "samples_per_step": 2}},
                       base_dir=tmp_path)
    return cfg.source("s")


TOKENS = pa.list_(pa.int32())


@pytest.mark.parametrize("keys, schema", [
    ({}, pa.schema([("text", pa.large_string()), ("other", pa.int64())])),
    ({"tokens_column": "ids"}, pa.schema([("ids", pa.large_list(pa.int64()))])),
    ({"tokens_column": "ids", "loss_mask_column": "mask"},
     pa.schema([("ids", TOKENS), ("mask", pa.list_(pa.bool_()))])),
    ({"image_column": "images"}, pa.schema([("text", pa.list_(pa.string())), ("images", pa.list_(pa.binary()))])),
])
def test_each_kind_of_source_reads_its_columns(tmp_path, keys, schema):
    source = _source(tmp_path, **keys)
    check_columns(source, "f.parquet", schema)
    assert set(wanted_columns(source)) <= set(schema.names)


@pytest.mark.parametrize("keys, schema, message", [
    ({}, pa.schema([("body", pa.string())]),
     r"source 's': file f.parquet has no column 'text' \(columns: body\)"),
    ({}, pa.schema([("text", pa.int64())]), "column 'text' of file f.parquet is int64, expected string"),
    ({"tokens_column": "ids"}, pa.schema([("ids", pa.list_(pa.float32()))]),
     "column 'ids' of file f.parquet is list<item: float>, expected a list of integer token ids"),
    ({"tokens_column": "ids", "loss_mask_column": "mask"}, pa.schema([("ids", TOKENS), ("mask", pa.string())]),
     "column 'mask' .* expected a list of 0/1 integers or booleans per token"),
    ({"image_column": "images"}, pa.schema([("text", pa.string()), ("images", pa.list_(pa.binary()))]),
     "column 'text' .* expected list<string>"),
])
def test_a_missing_or_unreadable_column_is_named(tmp_path, keys, schema, message):
    with pytest.raises(ConfigError, match=message):
        check_columns(_source(tmp_path, **keys), "f.parquet", schema)
