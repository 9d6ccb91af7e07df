"""make_many_sources / `overlord make-demo-data --sources N`: N distinct text sources, deterministic."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from flight_overlord.demo.data import SOURCE_NAMES, make_many_sources, many_source_names, many_source_plan

N, ROWS = 8, 40


def _read(paths):
    tables = [pq.read_table(p) for p in paths]
    return [t for tb in tables for t in tb["text"].to_pylist()], [d for tb in tables for d in tb["doc_id"].to_pylist()]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return make_many_sources(tmp_path_factory.mktemp("many"), N, seed=3, rows_per_source=ROWS)


def test_n_sources_written(written):
    assert list(written) == many_source_names(N) == [f"src{i:03d}" for i in range(N)]
    plan = many_source_plan(N, seed=3, rows_per_source=ROWS)
    for spec in plan:
        paths = written[spec["name"]]
        assert len(paths) == spec["files"] >= 2
        texts, ids = _read(paths)
        assert len(texts) == spec["rows"] and ids == list(range(spec["rows"]))
        assert all(pq.ParquetFile(p).num_row_groups >= 2 for p in paths)
    assert [s["generator"] for s in plan] == [SOURCE_NAMES[i % 6] for i in range(N)]
    assert len({s["rows"] for s in plan}) > 1  # varied sizes


def test_sources_distinct(written):
    contents = [tuple(_read(paths)[0]) for paths in written.values()]
    assert len(set(contents)) == N
    # even two sources over the same generator share few rows
    a, b = set(contents[0]), set(contents[6])
    assert len(a & b) < 0.5 * min(len(a), len(b))


def test_deterministic(written, tmp_path):
    again = make_many_sources(tmp_path, N, seed=3, rows_per_source=ROWS)
    for name in written:
        assert [p.read_bytes() for p in again[name]] == [p.read_bytes() for p in written[name]]
    assert many_source_plan(N, seed=4, rows_per_source=ROWS) != many_source_plan(N, seed=3, rows_per_source=ROWS)


def test_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        make_many_sources(tmp_path, 0)
    with pytest.raises(ValueError):
        make_many_sources(tmp_path, 2, rows_per_source=3)


def test_cli(tmp_path, capsys):
    from flight_overlord.deploy.cli import main
    main(["make-demo-data", str(tmp_path), "--sources", "3", "--rows-per-source", "20"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src000", "src001", "src002"]
    assert "src002:" in capsys.readouterr().out
