"""Tests for the deterministic demo corpus generator (small scale, so they run in seconds)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flight_overlord.demo_data import SOURCE_NAMES, make_demo_data

SCALE = 0.03


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo_seed0")
    return make_demo_data(out, seed=0, scale=SCALE)


def _texts(paths) -> list[str]:
    return [t for p in paths for t in pq.read_table(p, columns=["text"])["text"].to_pylist()]


def _byte_lengths(paths) -> np.ndarray:
    return np.array([len(t.encode("utf-8")) for t in _texts(paths)])


def test_sources_and_layout(corpus):
    assert tuple(corpus) == SOURCE_NAMES
    assert SOURCE_NAMES == ("captions", "longdocs", "code", "docstrings", "manuals", "qa")
    for name, paths in corpus.items():
        assert len(paths) >= 2, name
        for path in paths:
            assert path.parent.name == name and path.name.startswith("part-")
            meta = pq.ParquetFile(path).metadata
            assert meta.num_row_groups >= 2, path
            assert meta.row_group(0).column(0).compression == "ZSTD"
            schema = pq.read_schema(path)
            assert schema.names == ["text", "doc_id"]
            assert schema.field("text").type == pa.string()
            assert schema.field("doc_id").type == pa.int64()


def test_same_seed_is_byte_identical(corpus, tmp_path):
    again = make_demo_data(tmp_path, seed=0, scale=SCALE)
    for name in SOURCE_NAMES:
        assert [p.name for p in again[name]] == [p.name for p in corpus[name]]
        for a, b in zip(corpus[name], again[name]):
            assert a.read_bytes() == b.read_bytes(), (name, a.name)


def test_different_seed_differs(corpus, tmp_path):
    other = make_demo_data(tmp_path, seed=1, scale=SCALE)
    for name in SOURCE_NAMES:
        assert _texts(other[name]) != _texts(corpus[name]), name


def test_doc_ids_unique_per_source(corpus):
    for name, paths in corpus.items():
        ids = [i for p in paths for i in pq.read_table(p, columns=["doc_id"])["doc_id"].to_pylist()]
        assert len(ids) == len(set(ids)), name


def test_texts_non_empty(corpus):
    for name, paths in corpus.items():
        assert min(_byte_lengths(paths)) > 0, name


def test_captions_are_mostly_short_with_a_long_tail(corpus):
    lengths = _byte_lengths(corpus["captions"])
    assert np.mean(lengths <= 64) >= 0.95
    assert lengths.max() > 64


def test_longdocs_are_long(corpus):
    lengths = _byte_lengths(corpus["longdocs"])
    assert np.median(lengths) >= 1000
    assert lengths.min() >= 1000 and lengths.max() <= 8000


def test_source_distributions_differ(corpus):
    median = {name: np.median(_byte_lengths(paths)) for name, paths in corpus.items()}
    assert median["captions"] < median["qa"] < median["longdocs"]
    assert median["captions"] < median["code"] < median["longdocs"]


def test_qa_format(corpus):
    texts = _texts(corpus["qa"])
    assert all(t.startswith("Q: ") and "\nA: " in t for t in texts)


def test_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        make_demo_data(tmp_path, seed=-1, scale=SCALE)
    with pytest.raises(ValueError):
        make_demo_data(tmp_path, scale=0)
