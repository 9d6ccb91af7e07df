"""The Planner's catalogs by digest (planner/catalogs.py): from its own catalog cache, else from a loader
that registered with it (its digest derived again, then cached on the Planner's host), else from the
source's files; a Planner that finds it nowhere says where it looked, in one error."""
from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flight_overlord import source_catalog
from flight_overlord.config.parse import parse_config
from flight_overlord.planner.catalogs import CatalogCache
from flight_overlord.source_catalog import SourceCatalog, cached_catalog, catalog_table, load_catalog

RAW = {"sources": [{"name": "s", "paths": "part-*.parquet"}],
       "global_batch": {"context_length": 256, "microbatches": 1, "samples_per_step": 4}}
LOADERS = ["grpc://loader-a:1", "grpc://loader-b:2", "grpc://loader-c:3"]


class LoaderAnswers:
    """The loaders' side of ``CatalogFetch``, in memory: per location a table, or the error it raises."""

    def __init__(self, answers: dict):
        self.answers, self.asked = answers, []

    def __call__(self, location: str, source: str, digest: str) -> pa.Table:
        self.asked.append((location, source, digest))
        answer = self.answers[location]
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def loader_side(tmp_path, monkeypatch):
    """A source as its loader host sees it (its files, its own catalog cache): (config, catalog, the table its
    catalog ticket streams)."""
    data = tmp_path / "data"
    data.mkdir()
    for f in range(5):
        pq.write_table(pa.table({"text": [f"file {f} row {i}" for i in range(3 * (f + 1))]}),
                       data / f"part-{f}.parquet", row_group_size=3)
    monkeypatch.setenv(source_catalog.CATALOG_DIR_ENV, str(tmp_path / "loader-catalogs"))
    cfg = parse_config({**RAW, "run_dir": str(tmp_path / "run")}, base_dir=data)
    catalog = load_catalog(cfg.source("s"))
    return cfg, catalog, catalog_table(cfg.source("s"), catalog.digest())


@pytest.fixture
def planner_host(tmp_path, monkeypatch, loader_side):
    """The Planner's config: the same run, a data_root that does not exist on its host, its own empty cache."""
    monkeypatch.setenv(source_catalog.CATALOG_DIR_ENV, str(tmp_path / "planner-catalogs"))
    return parse_config({**RAW, "run_dir": str(tmp_path / "run"), "data_root": str(tmp_path / "no-data")},
                        base_dir=tmp_path, expand_files=False)


def test_a_catalog_the_planner_lacks_comes_from_the_registering_loader_and_is_cached_on_its_host(
        loader_side, planner_host, tmp_path):
    cfg, catalog, sent = loader_side
    digest = catalog.digest()
    loaders = LoaderAnswers({location: sent for location in LOADERS})
    assert CatalogCache(planner_host, loaders)("s", digest, LOADERS) == catalog.row_groups()
    assert loaders.asked == [(LOADERS[0], "s", digest)]  # the registering loader, first
    assert [p.name for p in (tmp_path / "planner-catalogs").iterdir()] == [f"{digest}.arrow"]
    kept = cached_catalog(digest)
    assert (kept.files, kept.file_ids, kept.rows.tolist()) == (catalog.files, catalog.file_ids, catalog.rows.tolist())

    restarted = LoaderAnswers({})  # a resume or a standby on this host: from its cache, nobody asked
    assert CatalogCache(planner_host, restarted)("s", digest, LOADERS) == catalog.row_groups()
    assert restarted.asked == []
    assert not planner_host.source("s").paths.expanded  # the data folder was never looked for


def test_a_catalog_that_is_not_its_digest_is_refused_and_the_next_loader_asked(loader_side, planner_host, caplog):
    cfg, catalog, _ = loader_side
    digest = catalog.digest()
    forged = SourceCatalog.from_table(catalog.to_table())
    forged.rows = forged.rows.copy()
    forged.rows[0] += 1  # one row group's count changed, the fingerprint it claims kept
    assert forged.to_table().schema.metadata[b"fingerprint"] == catalog.fingerprint().encode()
    loaders = LoaderAnswers({LOADERS[0]: forged.to_table(), LOADERS[1]: pa.ArrowKeyError("not this loader's"),
                             LOADERS[2]: catalog.to_table()})
    with caplog.at_level(logging.WARNING):
        assert CatalogCache(planner_host, loaders)("s", digest, LOADERS) == catalog.row_groups()
    assert [location for location, *_ in loaders.asked] == LOADERS
    assert f"not {digest}" in caplog.text and "not this loader's" in caplog.text


def test_with_no_loader_answering_the_files_say_and_without_them_the_error_names_every_place(
        loader_side, planner_host, tmp_path):
    cfg, catalog, _ = loader_side
    digest = catalog.digest()
    silent = LoaderAnswers({location: pa.ArrowIOError("unreachable") for location in LOADERS})
    with pytest.raises(ValueError) as refused:
        CatalogCache(planner_host, silent)("s", digest, LOADERS[:2])
    message = str(refused.value)
    assert "\n" not in message and f"catalog {digest} of source 's'" in message
    assert str(tmp_path / "planner-catalogs") in message
    assert f"{LOADERS[0]}: unreachable; {LOADERS[1]}: unreachable" in message
    assert "no file matches the glob" in message and str(tmp_path / "no-data") in message
    assert CatalogCache(cfg, silent)("s", digest, LOADERS[:1]) == catalog.row_groups()  # a host with the files


def test_a_planner_without_loaders_to_ask_checks_the_files_digest(loader_side):
    cfg, catalog, _ = loader_side
    with pytest.raises(ValueError, match="its files differ between hosts"):
        CatalogCache(cfg)("s", "0" * 32)
    assert CatalogCache(cfg)("s", catalog.digest()) == catalog.row_groups()
