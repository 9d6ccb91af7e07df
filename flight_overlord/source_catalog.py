"""A source's catalog: every chunk of its files (rows, bytes: Parquet row groups, Arrow IPC record
batches..., ``formats``), each file's size and modification time and its schema, read from the footers
(or indexes: an IPC stream file is scanned once) once per corpus and reused afterwards.

A start lists the files' sizes and modification times (``source_files.file_states``: a stat per local
file, one LIST per folder on object storage) and reads only the footers of files that are new or whose
size or time changed, ``FOOTER_READS`` at a time (threads: a footer read waits on storage, and a bounded
number keeps an object store from being flooded). The catalog is cached in ``catalog_dir()`` as an Arrow
IPC file named by its digest (``<digest>.arrow``, one row per file), and ``<list key>.json`` names the
latest digest of a file list: a run journals the digest (``planner/configs.json``), not its row groups,
and an offline replay finds the catalog it planned from by it. A cached file that cannot be read is
rebuilt, with a warning.
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np
import pyarrow as pa

from . import formats, source_files
from .config import ConfigError, SourceConfig
from .core.order import RowGroups
from .journal import write_bytes_atomic, write_text_atomic

log = logging.getLogger(__name__)
FOOTER_READS = 16  # footers read at once (object storage: ~16 requests in flight per process)
FOOTERS_PER_TASK = 64  # a thread's task of local files: a footer is read in ~20 us, a task per file costs as much again
CATALOG_DIR_ENV = "OVERLORD_CATALOG_DIR"
VALIDATED_ENV = "OVERLORD_VALIDATED_CATALOGS"  # {list key: digest}: see ValidatedCatalogs
FORMAT = 1  # of the cached file: another value is rebuilt


def catalog_dir() -> Path:
    """Where catalogs are cached: ``$OVERLORD_CATALOG_DIR``, else ``$XDG_CACHE_HOME`` (or ~/.cache)
    ``/flight_overlord/catalogs``."""
    if os.environ.get(CATALOG_DIR_ENV):
        return Path(os.environ[CATALOG_DIR_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flight_overlord" / "catalogs"


@dataclass
class FileFooter:
    """What a catalog keeps of one file's footer."""
    rows: list[int]
    nbytes: list[int]
    schema: pa.Schema


@dataclass
class SourceCatalog:
    """The files of a source (``files``: as logs show them, without a URI's query string) in the
    config's order, and their row groups: file i's are ``rows[offsets[i]:offsets[i + 1]]``."""
    files: list[str]
    file_ids: list[str]
    sizes: np.ndarray    # int64 per file
    mtimes: np.ndarray   # int64 ns per file
    offsets: np.ndarray  # int64, files + 1
    rows: np.ndarray     # int64 per row group
    nbytes: np.ndarray   # int64 per row group (Parquet's total_byte_size)
    schema_of: np.ndarray  # int32 per file: index into ``schemas``
    schemas: list[pa.Schema]
    known_fingerprint: str | None = field(default=None, compare=False)  # as cached: not derived again

    @property
    def num_row_groups(self) -> int:
        return len(self.rows)

    def row_groups(self) -> RowGroups:
        """Every row group, sorted (the order ``core.order`` works in: by file id, then row group)."""
        return RowGroups.of_files(pa.array(self.file_ids, pa.string()), self.offsets, self.rows)

    def schemas_by_file(self) -> list[tuple[str, pa.Schema]]:
        """Each distinct schema with the first file that has it."""
        first = {}
        for i, s in enumerate(self.schema_of.tolist()):
            first.setdefault(s, i)
        return [(self.files[first[s]], self.schemas[s]) for s in sorted(first, key=first.get)]

    def fingerprint(self) -> str:
        """A digest of the file names and, per row group, its rows and bytes (other contents under the
        same name change the bytes): the one ``planner/sources.json`` has kept since runs began."""
        if self.known_fingerprint is not None:
            return self.known_fingerprint
        parts = [[fid, [[int(r), int(b)] for r, b in zip(self.rows[lo:hi].tolist(), self.nbytes[lo:hi].tolist())]]
                 for fid, lo, hi in zip(self.file_ids, self.offsets[:-1].tolist(), self.offsets[1:].tolist())]
        self.known_fingerprint = hashlib.blake2b(json.dumps(sorted(parts)).encode(), digest_size=16).hexdigest()
        return self.known_fingerprint

    def digest(self) -> str:
        """The name of this catalog in the cache: its files (as listed) and fingerprint."""
        return _blake("\n".join(self.files), self.fingerprint())

    def to_table(self) -> pa.Table:
        offsets = pa.array(self.offsets, pa.int32())
        lists = lambda values: pa.ListArray.from_arrays(offsets, pa.array(values, pa.int64()))  # noqa: E731
        schemas = [base64.b64encode(s.serialize().to_pybytes()).decode() for s in self.schemas]
        return pa.table({"file": self.files, "file_id": self.file_ids, "size": self.sizes, "mtime_ns": self.mtimes,
                         "rows": lists(self.rows), "bytes": lists(self.nbytes),
                         "schema": pa.array(self.schema_of, pa.int32())},
                        metadata={"format": str(FORMAT), "schemas": json.dumps(schemas),
                                  "fingerprint": self.fingerprint()})

    @classmethod
    def from_table(cls, table: pa.Table) -> "SourceCatalog":
        meta = table.schema.metadata or {}
        if meta.get(b"format") != str(FORMAT).encode():
            raise ValueError(f"format {meta.get(b'format')!r}, not {FORMAT}")
        schemas = [pa.ipc.read_schema(pa.py_buffer(base64.b64decode(s))) for s in json.loads(meta[b"schemas"])]
        rows = table.column("rows").combine_chunks()
        schema_of = table.column("schema").to_numpy().astype(np.int32)
        if len(schema_of) and not 0 <= schema_of.min() <= schema_of.max() < len(schemas):
            raise ValueError("a file's schema index is out of range")
        return cls(files=table.column("file").to_pylist(), file_ids=table.column("file_id").to_pylist(),
                   sizes=table.column("size").to_numpy(), mtimes=table.column("mtime_ns").to_numpy(),
                   offsets=rows.offsets.to_numpy().astype(np.int64), rows=rows.values.to_numpy(),
                   nbytes=table.column("bytes").combine_chunks().values.to_numpy(), schema_of=schema_of,
                   schemas=schemas, known_fingerprint=meta[b"fingerprint"].decode())


def _blake(*parts: str) -> str:
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=16).hexdigest()


def list_key(source: SourceConfig) -> str:
    """The cache's name of a source's file list."""
    return _blake(*(source_files.display(p) for p in source.files))


@dataclass
class ValidatedCatalogs:
    """The catalogs one start found its files to match (``digests``: list key -> digest), owned by that
    start: ``overlord up`` validates every source's before any role starts and hands them to the role
    processes it starts in their environment (``env``), which take them without a ``stat`` per file again
    (``from_env``, read once at a role's start). A process started without them (``overlord serve``, Ray)
    validates for itself."""
    digests: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "ValidatedCatalogs":
        """The record the start that launched this process handed it (empty: none, or unreadable)."""
        text = environ.get(VALIDATED_ENV)
        if not text:
            return cls()
        try:
            digests = json.loads(text)
            if not isinstance(digests, dict):
                raise ValueError("not a JSON object")
            return cls({str(key): str(digest) for key, digest in digests.items()})
        except ValueError as exc:
            log.warning("%s cannot be read (%s): this process validates the catalogs itself", VALIDATED_ENV, exc)
            return cls()

    def env(self) -> dict[str, str]:
        """The environment variable that hands this record to a child process ({} when empty)."""
        return {VALIDATED_ENV: json.dumps(self.digests)} if self.digests else {}

    def catalog(self, source: SourceConfig, key: str, files: list[str]) -> SourceCatalog | None:
        """The catalog recorded for file list ``key``, if it is cached and still lists the source's files."""
        digest = self.digests.get(key)
        catalog = cached_catalog(digest) if digest else None
        if catalog is None or catalog.files != files or catalog.file_ids != list(source.file_ids):
            return None
        return catalog

    def record(self, key: str, catalog: SourceCatalog) -> None:
        self.digests[key] = catalog.digest()


def load_catalog(source: SourceConfig, validated: ValidatedCatalogs | None = None) -> SourceCatalog:
    """The source's catalog: the cached one where its files' sizes and times still hold, the footers of
    the others read now (and the cache updated). ``validated``: a start's record, whose catalog for these
    files is taken without a ``stat`` per file, and which records the catalog validated otherwise."""
    files = [source_files.display(p) for p in source.files]
    key = _blake(*files)  # list_key(source), the names already made
    catalog = validated.catalog(source, key, files) if validated is not None else None
    if catalog is None:
        catalog = _validated_now(source, files, key)
        if validated is not None:
            validated.record(key, catalog)
    catalog.file_ids = list(source.file_ids)  # the config's strings (equal): one copy per process
    return catalog


def _validated_now(source: SourceConfig, files: list[str], key: str) -> SourceCatalog:
    """``load_catalog`` with a ``stat`` of every file (a listing per folder on object storage)."""
    try:
        states = source_files.file_states(list(source.files))
    except source_files.StorageError as exc:
        raise ConfigError(f"sources.{source.name}: {exc}") from None
    cached = _cached(source, files, key)
    known = {}
    if cached is not None:
        known = {f: i for i, f in enumerate(cached.files)}
    footers: dict[int, FileFooter] = {}
    stale = [i for i, f in enumerate(files)
             if f not in known or (int(cached.sizes[known[f]]), int(cached.mtimes[known[f]])) != states[i]]
    if not stale and cached is not None:
        return cached
    for i, footer in zip(stale, read_footers(source, [source.files[i] for i in stale])):
        footers[i] = footer
    catalog = _assemble(source, files, states, footers, cached, known)
    _store(source, key, catalog)
    return catalog


def read_footers(source: SourceConfig, paths: list[str]) -> list[FileFooter]:
    """The footers (or indexes) of ``paths``, ``FOOTER_READS`` at a time, in the source's format
    (``formats.open_chunks``: a chunk is a Parquet row group, an IPC record batch...); an unreadable file
    is a ConfigError naming it."""
    def read(path: str) -> FileFooter:
        try:
            with formats.open_chunks(path, source.format) as opened:
                chunks = range(opened.num_chunks)
                return FileFooter([opened.chunk_rows(i) for i in chunks], [opened.chunk_bytes(i) for i in chunks],
                                  opened.schema)
        except source_files.StorageError as exc:
            raise ConfigError(f"sources.{source.name}: {exc}") from None
    if len(paths) == 1:
        return [read(paths[0])]
    # a local footer is cheap next to a thread's task; a remote one waits on a round trip: one file a task
    per_task = 1 if source_files.is_uri(paths[0]) else FOOTERS_PER_TASK
    batches = [paths[i:i + per_task] for i in range(0, len(paths), per_task)]
    with ThreadPoolExecutor(min(FOOTER_READS, len(batches)), thread_name_prefix="footers") as pool:
        return [footer for batch in pool.map(lambda batch: [read(p) for p in batch], batches) for footer in batch]


def _assemble(source: SourceConfig, files: list[str], states: list[tuple[int, int]], footers: dict[int, FileFooter],
              cached: SourceCatalog | None, known: dict[str, int]) -> SourceCatalog:
    """The catalog of ``files``: file i from ``footers[i]`` when read now, else from ``cached``."""
    schemas: list[pa.Schema] = [] if cached is None else list(cached.schemas)
    rows, nbytes, schema_of, counts = [], [], [], []
    for i, f in enumerate(files):
        if i in footers:
            footer = footers[i]
            index = next((k for k, s in enumerate(schemas) if s.equals(footer.schema, check_metadata=True)), None)
            if index is None:
                schemas.append(footer.schema)
                index = len(schemas) - 1
            r, b = np.asarray(footer.rows, np.int64), np.asarray(footer.nbytes, np.int64)
        else:
            j = known[f]
            lo, hi = cached.offsets[j], cached.offsets[j + 1]
            r, b, index = cached.rows[lo:hi], cached.nbytes[lo:hi], int(cached.schema_of[j])
        rows.append(r)
        nbytes.append(b)
        schema_of.append(index)
        counts.append(len(r))
    used = sorted(set(schema_of))  # drop schemas no file has any more
    remap = {old: new for new, old in enumerate(used)}
    empty = np.zeros(0, np.int64)
    return SourceCatalog(
        files=files, file_ids=list(source.file_ids),
        sizes=np.array([s for s, _ in states], np.int64), mtimes=np.array([m for _, m in states], np.int64),
        offsets=np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64),
        rows=np.concatenate(rows) if rows else empty, nbytes=np.concatenate(nbytes) if nbytes else empty,
        schema_of=np.array([remap[s] for s in schema_of], np.int32), schemas=[schemas[k] for k in used])


def cached_catalog(digest: str) -> SourceCatalog | None:
    """The cached catalog of digest ``digest`` (a run's journaled reference), None when it is not there
    or cannot be read."""
    return _read_cached(digest, SourceCatalog.from_table)


def cached_row_groups(digest: str) -> RowGroups | None:
    """The row groups of the cached catalog ``digest`` (what a Planner needs of it), read as columns: no
    Python object per file or row group."""
    def row_groups(table: pa.Table) -> RowGroups:
        rows = _one_chunk(table.column("rows"))
        return RowGroups.of_files(_one_chunk(table.column("file_id")), rows.offsets.to_numpy(), rows.values.to_numpy())
    return _read_cached(digest, row_groups)


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array: its chunk where it has one, a view into the memory-mapped file (``RowGroups``
    copies what it keeps: a view kept would keep every page of the file mapped and counted)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _read_cached(digest: str, read):
    """``read(table)`` of the cached catalog ``digest``; None when it is not there or cannot be read."""
    path = catalog_dir() / f"{digest}.arrow"
    if not path.exists():
        return None
    try:
        with pa.memory_map(str(path)) as source:
            return read(pa.ipc.open_file(source).read_all())
    except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
        log.warning("catalog %s cannot be read (%s): ignored", path, exc)
        return None


def _cached(source: SourceConfig, files: list[str], key: str) -> SourceCatalog | None:
    """The latest cached catalog of the source's file list (None: none yet, or unreadable: rebuilt)."""
    pointer = catalog_dir() / f"{key}.json"
    try:
        digest = json.loads(pointer.read_text())["digest"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("source %s: catalog pointer %s cannot be read (%s): rebuilding the catalog",
                    source.name, pointer, exc)
        return None
    catalog = cached_catalog(str(digest))
    if catalog is None:
        log.warning("source %s: its cached catalog %s is missing or unreadable: rebuilding it", source.name, digest)
        return None
    if catalog.files != files or catalog.file_ids != list(source.file_ids):
        return None  # another corpus under the same names: rebuilt
    return catalog


def _store(source: SourceConfig, key: str, catalog: SourceCatalog) -> None:
    """Cache ``catalog`` under the source's list ``key`` (best effort: a cache that cannot be written only
    costs the next start its footers)."""
    folder = catalog_dir()
    try:
        _write(catalog)
        write_text_atomic(folder / f"{key}.json",
                          json.dumps({"source": source.name, "digest": catalog.digest()}))
    except OSError as exc:
        log.warning("source %s: cannot cache its catalog in %s (%s): the next start reads its footers again",
                    source.name, folder, exc)


def _write(catalog: SourceCatalog) -> None:
    """``catalog`` into the cache as ``<digest>.arrow``."""
    sink = pa.BufferOutputStream()
    table = catalog.to_table()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    write_bytes_atomic(catalog_dir() / f"{catalog.digest()}.arrow", sink.getvalue().to_pybytes())


# -- a catalog sent between hosts: a loader's to a Planner that has neither the cache nor the files ------------

def catalog_table(source: SourceConfig, digest: str) -> pa.Table:
    """The table of ``source``'s catalog ``digest`` (what a loader sends its Planner): the cached file, else
    the source's catalog as its files give it now, which must be that one (KeyError otherwise)."""
    table = _read_cached(digest, lambda table: table)
    if table is not None:
        return table
    catalog = load_catalog(source)  # the cache could not be written here, or was emptied since
    if catalog.digest() != digest:
        raise KeyError(f"catalog {digest} of source {source.name!r} is neither in this host's catalog cache nor "
                       f"what its files give now ({catalog.digest()})")
    return catalog.to_table()


def received_catalog(table: pa.Table, digest: str) -> SourceCatalog:
    """A catalog another process sent (``catalog_table``), its digest derived again from its contents (not
    taken from the sender's word): ValueError when it is not ``digest``."""
    catalog = SourceCatalog.from_table(table)
    catalog.known_fingerprint = None
    if catalog.digest() != digest:
        raise ValueError(f"what was sent has digest {catalog.digest()}, not {digest}")
    return catalog


def keep_received(catalog: SourceCatalog) -> None:
    """Cache a received catalog by its digest, so that a resume, a standby or an audit on this host finds
    it (best effort: without it they ask a loader again). No pointer by file list: this host may not
    see the files."""
    try:
        _write(catalog)
    except OSError as exc:
        log.warning("cannot cache catalog %s in %s (%s): a resume asks a loader for it again", catalog.digest(),
                    catalog_dir(), exc)
