"""make_long_tail / `overlord make-demo-data --long-tail MAX_TOKENS`: a heavy-tailed length
distribution up to the given maximum, byte tokens = bytes, deterministic."""
from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from flight_overlord.demo.long_tail import long_tail_lengths, long_tail_name, make_long_tail
from flight_overlord.deploy.cli import main
from flight_overlord.transforms import make_transform


def _lengths(paths) -> np.ndarray:
    return np.concatenate([pc.binary_length(pq.read_table(p)["text"]).to_numpy() for p in paths])


@pytest.mark.parametrize("max_tokens", [32768, 262144])
def test_lengths_are_long_tailed(max_tokens):
    lengths = long_tail_lengths(50_000, max_tokens, seed=1)
    assert lengths.min() >= 16 and lengths.max() <= max_tokens
    assert np.median(lengths) < 1024                      # most samples short ...
    assert (lengths < 4096).mean() > 0.9
    long = lengths >= max_tokens // 4
    assert 0.01 < long.mean() < 0.05                      # ... a few long, up to the maximum
    assert lengths.max() > 0.9 * max_tokens
    assert lengths[long].sum() > 0.2 * lengths.sum()      # and those few carry much of the tokens


def test_written_source_matches_lengths_and_is_deterministic(tmp_path):
    a = make_long_tail(tmp_path / "a", "lt", rows=600, max_tokens=4096, seed=5)
    b = make_long_tail(tmp_path / "b", "lt", rows=600, max_tokens=4096, seed=5)
    c = make_long_tail(tmp_path / "c", "lt", rows=600, max_tokens=4096, seed=6)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert [p.read_bytes() for p in a] != [p.read_bytes() for p in c]
    assert len(a) >= 2 and all(pq.ParquetFile(p).num_row_groups >= 2 for p in a)
    np.testing.assert_array_equal(_lengths(a), long_tail_lengths(600, 4096, seed=5))
    ids = np.concatenate([pq.read_table(p)["doc_id"].to_numpy() for p in a])
    np.testing.assert_array_equal(ids, np.arange(600))
    # under the byte tokenizer a row of L bytes is L tokens
    column = pq.read_table(a[0])["text"]
    tokens = make_transform("byte_tokenizer")(column, 1 << 20)
    np.testing.assert_array_equal(pc.list_value_length(tokens).to_numpy(), pc.binary_length(column).to_numpy())


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="max_tokens"):
        long_tail_lengths(10, 32)
    with pytest.raises(ValueError, match="rows"):
        long_tail_lengths(0, 4096)
    with pytest.raises(ValueError, match="tail_fraction"):
        long_tail_lengths(10, 4096, tail_fraction=1.5)


def test_cli_flag(tmp_path, capsys):
    main(["make-demo-data", str(tmp_path), "--long-tail", "8192", "--long-tail-rows", "200", "--seed", "2"])
    assert long_tail_name(8192) == "longtail_8k" and long_tail_name(5000) == "longtail_5000"
    paths = sorted((tmp_path / "longtail_8k").glob("*.parquet"))
    np.testing.assert_array_equal(_lengths(paths), long_tail_lengths(200, 8192, seed=2))
    assert "longtail_8k" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--long-tail.*max_tokens"):
        main(["make-demo-data", str(tmp_path), "--long-tail", "10"])
