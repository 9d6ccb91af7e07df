"""A source's catalog is read from the footers once per corpus and reused while every file keeps its
size and modification time; a changed file's footer is read again, a corrupt cached catalog is
rebuilt with a warning, and the fingerprint is the one runs have always kept. A loader sends the catalog
it registered with to a Planner that lacks it, which derives its digest again."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from flight_overlord import source_catalog
from flight_overlord.config import ConfigError, load_config
from flight_overlord.config.parse import parse_config
from flight_overlord.core.order import RowGroupRef
from flight_overlord.source_catalog import (
    ValidatedCatalogs,
    cached_catalog,
    catalog_dir,
    catalog_table,
    list_key,
    load_catalog,
    received_catalog,
)


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setenv(source_catalog.CATALOG_DIR_ENV, str(tmp_path / "catalogs"))
    data = tmp_path / "data"
    data.mkdir()
    for f in range(6):
        write(data / f"part-{f}.parquet", rows=4 * (f + 1), row_group_size=4)
    cfg = parse_config({"sources": [{"name": "s", "paths": "part-*.parquet"}], "run_dir": str(tmp_path / "run"),
                        "global_batch": {"context_length": 256, "microbatches": 1, "samples_per_step": 4}},
                       base_dir=data)
    return cfg.source("s")


def write(path, *, rows: int, row_group_size: int, column: str = "text") -> None:
    table = pa.table({column: [f"{path.name} row {i}" for i in range(rows)]})
    pq.write_table(table, path, row_group_size=row_group_size)


@pytest.fixture
def footers_read(monkeypatch) -> list[str]:
    """The files whose footers the catalog reads (spied, still read)."""
    read, original = [], source_catalog.read_footers

    def spy(source, paths):
        read.extend(paths)
        return original(source, paths)
    monkeypatch.setattr(source_catalog, "read_footers", spy)
    return read


@pytest.fixture
def stats(monkeypatch) -> list[int]:
    """How many files each validation stats (spied, still stat'ed)."""
    from flight_overlord import source_files
    counted, original = [], source_files.file_states

    def spy(paths):
        counted.append(len(paths))
        return original(paths)
    monkeypatch.setattr(source_files, "file_states", spy)
    return counted


def one_source_config(directory: pathlib.Path, name: str, files) -> pathlib.Path:
    """A run config (in ``directory``) of one source, ``name``, over ``files``."""
    raw = {"sources": [{"name": name, "paths": [str(f) for f in files]}], "run_dir": str(directory / "run"),
           "global_batch": {"context_length": 256, "microbatches": 1, "samples_per_step": 4}}
    directory.mkdir(parents=True)
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def footer_row_groups(source) -> list[RowGroupRef]:
    refs = []
    for path, file_id in zip(source.files, source.file_ids):
        meta = pq.read_metadata(path)
        refs += [RowGroupRef(file_id, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
    return sorted(refs)


def test_a_second_load_reuses_the_catalog_and_reads_no_footer(source, footers_read):
    first = load_catalog(source)
    assert sorted(footers_read) == sorted(source.files)
    assert first.row_groups() == footer_row_groups(source)  # 1 + 2 + ... + 6 row groups
    footers_read.clear()
    again = load_catalog(source)
    assert footers_read == []
    assert again.row_groups() == first.row_groups() and again.digest() == first.digest()
    assert cached_catalog(first.digest()).row_groups() == first.row_groups()  # a run's reference finds it


def test_a_file_with_another_size_or_time_is_read_again(source, footers_read):
    before = load_catalog(source)
    changed = source.files[2]
    write(pathlib.Path(changed), rows=10, row_group_size=5)  # other row groups under the same name
    touched = source.files[4]
    st = os.stat(touched)
    os.utime(touched, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same bytes, another time
    footers_read.clear()
    after = load_catalog(source)
    assert sorted(footers_read) == sorted([changed, touched])
    assert after.row_groups() == footer_row_groups(source) != before.row_groups()
    assert after.fingerprint() != before.fingerprint()
    footers_read.clear()
    load_catalog(source)
    assert footers_read == []  # the updated catalog was cached


def test_a_corrupt_catalog_is_rebuilt_with_a_warning(source, footers_read, caplog):
    digest = load_catalog(source).digest()
    (catalog_dir() / f"{digest}.arrow").write_bytes(b"not an Arrow file")
    footers_read.clear()
    with caplog.at_level(logging.WARNING, logger="flight_overlord.source_catalog"):
        rebuilt = load_catalog(source)
    assert sorted(footers_read) == sorted(source.files)
    assert rebuilt.row_groups() == footer_row_groups(source)
    assert any("rebuilding" in r.getMessage() for r in caplog.records), caplog.text
    (catalog_dir() / f"{list_key(source)}.json").write_text("{not json")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flight_overlord.source_catalog"):
        assert load_catalog(source).row_groups() == rebuilt.row_groups()
    assert any("rebuilding" in r.getMessage() for r in caplog.records), caplog.text


def test_the_fingerprint_is_the_one_runs_have_kept(source):
    """planner/sources.json of a run started before catalogs holds this digest: a resume must match it."""
    parts = []
    for path, file_id in zip(source.files, source.file_ids):
        meta = pq.read_metadata(path)
        parts.append([file_id, [[meta.row_group(i).num_rows, meta.row_group(i).total_byte_size]
                                for i in range(meta.num_row_groups)]])
    expected = hashlib.blake2b(json.dumps(sorted(parts)).encode(), digest_size=16).hexdigest()
    assert load_catalog(source).fingerprint() == expected


def test_an_unreadable_file_is_named(source):
    with open(source.files[3], "wb") as f:
        f.write(b"this is not parquet at all")
    with pytest.raises(ConfigError, match=f"sources.s: cannot read Parquet file {source.files[3]}"):
        load_catalog(source)


def test_each_schema_is_checked_with_the_first_file_that_has_it(source):
    from flight_overlord.loader.row_groups import checked_catalog
    write(pathlib.Path(source.files[1]), rows=4, row_group_size=4, column="body")
    with pytest.raises(ConfigError, match=f"file {source.files[1]} has no column 'text'"):
        checked_catalog(source)


def test_local_matches_are_what_glob_and_resolve_give(tmp_path):
    """The fast listing of a source's files gives glob's matches, the files each resolved and the
    folders (a datasets folder) as glob names them, whatever the pattern."""
    import glob

    from flight_overlord.source_files import local_matches
    data, other = tmp_path / "data", tmp_path / "other"
    (data / "sub").mkdir(parents=True)
    other.mkdir()
    for p in (data / "a.parquet", data / ".hidden.parquet", data / "sub" / "b.parquet", other / "x.parquet"):
        p.write_bytes(b"x")
    (data / "folder.parquet").mkdir()  # a folder that matches: a folder, not a file
    (data / "link.parquet").symlink_to(other / "x.parquet")  # followed, as Path.resolve does
    (data / "broken.parquet").symlink_to(other / "gone.parquet")
    (data / "linked.parquet").symlink_to(data / "sub")  # a link to a folder: a folder
    (tmp_path / "alias").symlink_to(data)  # a linked folder: resolved once
    for pattern in ("data/*.parquet", "alias/*.parquet", "data/.*.parquet", "data/a.parquet", "data/**/*.parquet",
                    "*/*.parquet", "data/missing/*.parquet"):
        full = str(tmp_path / pattern)
        matches = glob.glob(full, recursive=True)
        files = sorted(str(pathlib.Path(m).resolve()) for m in matches if os.path.isfile(m))
        folders = sorted(m for m in matches if os.path.isdir(m))
        assert local_matches(full) == (files, folders), pattern


def test_a_loader_registered_by_catalog_digest_owns_what_its_listed_row_groups_said(source, tmp_path):
    """The Planner's roster derives each actor's share from the catalog the loaders name: the same
    owners as the row groups listed one by one, a digest (not the row groups) in its saved state."""
    import dataclasses

    from flight_overlord.core.order import owned_row_groups
    from flight_overlord.planner.roster import Roster
    spec = dataclasses.replace(source, loaders=3)
    cfg = parse_config({"sources": [{"name": "s", "paths": "part-*.parquet", "loaders": 3}],
                        "run_dir": str(tmp_path / "run"),
                        "global_batch": {"context_length": 256, "microbatches": 1, "samples_per_step": 4}},
                       base_dir=pathlib.Path(source.files[0]).parent)
    catalog = load_catalog(spec)
    digest = catalog.digest()
    asked = []

    def catalog_of(name, d, locations):
        asked.append((name, d, tuple(locations)))
        return catalog.row_groups()
    by_digest, listed = Roster(cfg, 1, catalog_of), Roster(cfg, 1)
    for actor in range(3):
        by_digest.register_loader("s", actor, 0, f"grpc://127.0.0.1:{actor + 1}", digest)
        share = owned_row_groups(catalog.row_groups(), actor, 3)
        listed.register_loader("s", actor, 0, f"grpc://127.0.0.1:{actor + 1}",
                               [[rg.file, rg.row_group, rg.num_rows] for rg in share])
    rgs = catalog.row_groups()
    assert by_digest.source_row_groups("s") == listed.source_row_groups("s") == rgs
    assert [by_digest.owner("s", rg.file, rg.row_group) for rg in rgs] == \
        [listed.owner("s", rg.file, rg.row_group) for rg in rgs]
    assert asked == [("s", digest, ("grpc://127.0.0.1:1",))]  # once, the registering loader to ask
    assert {loader[4] for loader in by_digest.state_dict()["loaders"]} == {digest}
    restored = Roster(cfg, 1, catalog_of)
    restored.load_state_dict(by_digest.state_dict())
    assert restored.source_row_groups("s") == by_digest.source_row_groups("s")
    assert [restored.share_size("s", a) for a in range(3)] == [listed.share_size("s", a) for a in range(3)]
    with pytest.raises(KeyError):
        by_digest.owner("s", "no-such-file.parquet", 0)
    with pytest.raises(ValueError, match="its peers with"):
        by_digest.register_loader("s", 1, 0, "grpc://127.0.0.1:2", "another-digest")


def test_a_read_orders_epoch_is_epoch_order():
    """ReadOrder sorts an array of hashes: the same order as ``epoch_order``'s key, for any files."""
    import numpy as np

    from flight_overlord.core.order import ReadOrder, epoch_order
    rng = np.random.default_rng(3)
    catalog = [RowGroupRef(f"d{rng.integers(0, 5)}/part-{f:05d}.parquet", g, int(rng.integers(1, 50)))
               for f in rng.choice(10_000, 400, replace=False) for g in range(int(rng.integers(1, 4)))]
    order = ReadOrder("web", reversed(catalog), seed=11)
    for epoch in range(3):
        assert [order.row_groups[i] for i in order.epoch(epoch)] == \
            epoch_order(catalog, seed=11, source="web", epoch=epoch)


def test_a_config_loaded_without_expanding_lists_no_folder_until_asked(source, tmp_path, monkeypatch):
    """The Planner's and constructors' config (``expand_files=False``) lists no source folder: the Planner
    finds a loader's row groups by catalog digest in the cache; a pattern that matches nothing is the same
    ConfigError, when the files are first asked for; the files are those of an expanded config."""
    from flight_overlord import source_files
    from flight_overlord.planner.catalogs import CatalogCache
    digest = load_catalog(source).digest()
    raw = {"sources": [{"name": "s", "paths": "part-*.parquet"}, {"name": "none", "paths": "nothing-*.parquet"}],
           "run_dir": str(tmp_path / "run"),
           "global_batch": {"context_length": 256, "microbatches": 1, "samples_per_step": 4}}
    listed = []
    original = source_files.local_matches
    monkeypatch.setattr(source_files, "local_matches", lambda full: listed.append(full) or original(full))
    lazy = parse_config(raw, base_dir=pathlib.Path(source.files[0]).parent, expand_files=False)
    assert CatalogCache(lazy)("s", digest) == footer_row_groups(source)
    assert listed == [] and not lazy.source("s").paths.expanded
    assert lazy.source("s").files == source.files and lazy.source("s").file_ids == source.file_ids
    assert lazy.source("s").paths == source.paths
    with pytest.raises(ConfigError, match=r"sources\[1\]\.paths: no file matches the glob"):
        lazy.source("none").files


def test_the_roles_of_a_start_take_the_catalogs_it_validated_without_a_stat_per_file(source, stats):
    """``overlord up`` validates each source's catalog (a stat per file) into the start's record and hands
    it to the roles it starts (``ValidatedCatalogs.env``); a role takes the catalog it names without a stat,
    and validates for itself where it was handed none or one whose catalog is not in the cache."""
    start = ValidatedCatalogs()
    validated = load_catalog(source, start)
    assert start.digests == {list_key(source): validated.digest()} and stats == [len(source.files)]
    taken = load_catalog(source, ValidatedCatalogs.from_env(start.env()))
    assert stats == [len(source.files)] and taken.digest() == validated.digest()
    assert taken.row_groups() == validated.row_groups()
    handed = ValidatedCatalogs.from_env({source_catalog.VALIDATED_ENV: json.dumps({list_key(source): "0" * 32})})
    assert load_catalog(source, handed).digest() == validated.digest() and stats == [len(source.files)] * 2
    assert handed.digests == start.digests  # what it validated itself replaces what it was handed
    unreadable = ValidatedCatalogs.from_env({source_catalog.VALIDATED_ENV: "not json"})
    assert unreadable.digests == {}
    load_catalog(source, unreadable)
    load_catalog(source)
    assert stats == [len(source.files)] * 4


def test_a_record_whose_catalog_lists_other_files_is_validated_again(source, tmp_path, stats):
    """A child handed a digest whose catalog no longer lists the source's files validates for itself."""
    other = load_config(one_source_config(tmp_path / "other", "other", source.files[:2])).source("other")
    stale = load_catalog(other).digest()
    handed = ValidatedCatalogs({list_key(source): stale})
    assert load_catalog(source, handed).row_groups() == footer_row_groups(source)
    assert stats == [2, len(source.files)] and handed.digests[list_key(source)] != stale


def test_two_starts_in_one_process_do_not_share_their_record(source, tmp_path, stats, monkeypatch):
    """Two ``overlord up`` starts in one process (a test session, a notebook): the second start's role
    processes are handed only the catalogs the second start validated, the first's are validated again.
    The backend's spawn is stopped at the first child (no process)."""
    from flight_overlord.deploy import launch
    first = one_source_config(tmp_path / "first", "first", source.files[:3])
    second = one_source_config(tmp_path / "second", "second", source.files[3:])
    handed = []

    class Spawned(Exception):
        pass

    def popen(cmd, env, **kwargs):
        handed.append(ValidatedCatalogs.from_env(env).digests)
        raise Spawned
    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    for config_path in (first, second):
        with pytest.raises(Spawned):
            launch.LocalCluster(config_path, supervise=False).start()
    assert stats == [3, 3]  # a stat per file per start
    first_source, second_source = load_config(first).source("first"), load_config(second).source("second")
    assert handed == [{list_key(first_source): load_catalog(first_source).digest()},
                      {list_key(second_source): load_catalog(second_source).digest()}]
    load_catalog(first_source, ValidatedCatalogs(handed[1]))  # a child of the second start
    assert stats == [3, 3, 3, 3, 3]


def test_a_loader_sends_the_catalog_it_registered_with_from_its_cache_or_else_its_files(source):
    catalog = load_catalog(source)
    digest = catalog.digest()
    sent = catalog_table(source, digest)
    assert sent.equals(catalog.to_table()) and sent.schema.metadata == catalog.to_table().schema.metadata
    (catalog_dir() / f"{digest}.arrow").unlink()  # not cached (an unwritable cache, or emptied since)
    assert received_catalog(catalog_table(source, digest), digest).row_groups() == catalog.row_groups()
    with pytest.raises(KeyError, match="neither in this host's catalog cache nor what its files give now"):
        catalog_table(source, "0" * 32)
    with pytest.raises(ValueError, match=f"what was sent has digest {digest}, not {'0' * 32}"):
        received_catalog(sent, "0" * 32)
