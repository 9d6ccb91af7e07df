"""``overlord convert``: JSON Lines (``.jsonl``, ``.json``, compressed ``.gz``, ``.bz2``, ``.zst``),
WebDataset tar shards (``.tar``, ``.tar.gz``, ``.tgz``) and MosaicML MDS datasets (a folder with
``index.json``: ``mds.py``) into Parquet files with row groups sized for the loader.

pyarrow does the work: ``pa.input_stream(..., compression="detect")`` decompresses by the file's
suffix (zstd, gzip, bz2, lz4 are pyarrow's own codecs: no other package), ``pyarrow.json.read_json``
parses and infers the types over the whole file (a field that first appears late is kept, earlier
rows get nulls), ``ParquetWriter`` writes. A WebDataset shard is read with the standard library's
``tarfile`` (streamed, compressed or not): consecutive members sharing a key (the name up to the first
dot of its base name) are one sample, a row with ``__key__`` and one column per extension: text for
``TEXT_EXTENSIONS``, binary for the rest (images, audio, anything); a sample without an extension gets
a null there. One input file is held in memory at a time.

A row group holds about ``row_group_bytes`` of Arrow data (default 1 MiB): a loader reads a row group
at once and reads ahead while its buffer is under ``loader.read_ahead_bytes`` (4 MiB), so a row group
of ~1 MiB keeps two in flight; ``row_groups_per_file`` of them make a file ``part-NNNNN.parquet``.
The output is a function of the inputs and the options (same files, same rows, same row groups).
"""
from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq
from tqdm import tqdm

from ..errors import ConfigError
from . import mds

ROW_GROUP_BYTES = 1 << 20
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
TEXT_EXTENSIONS = {"txt", "text", "json", "jsn", "cls", "cls2", "caption", "transcript", "md", "html", "id"}
ROW_GROUPS_PER_FILE = 64


class Converter:
    """Writes row groups of about ``row_group_bytes`` into ``out_dir/part-NNNNN.parquet`` files."""

    def __init__(self, out_dir: Path, row_group_bytes: int, row_groups_per_file: int):
        self.out_dir = out_dir
        self.row_group_bytes = row_group_bytes
        self.row_groups_per_file = row_groups_per_file
        self.schema: pa.Schema | None = None
        self.pending: pa.Table | None = None  # rows not written yet
        self.writer: pq.ParquetWriter | None = None
        self.groups_in_file = 0
        self.files: list[Path] = []

    def add(self, table: pa.Table, source: str) -> None:
        if self.schema is None:
            self.schema = table.schema
        elif table.schema != self.schema:
            try:
                table = table.select(self.schema.names).cast(self.schema)
            except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
                raise ConfigError(f"convert: {source}: its fields differ from the first file's ({exc}); keep "
                                  f"the same fields with --columns") from None
        pending = table if self.pending is None else pa.concat_tables([self.pending, table])
        while pending.num_rows and pending.nbytes >= self.row_group_bytes:
            rows = max(1, self.row_group_bytes * pending.num_rows // pending.nbytes)  # rows of about that size
            self._write_row_group(pending.slice(0, rows))
            pending = pending.slice(rows)
        self.pending = pending

    def close(self) -> list[Path]:
        if self.pending is not None and self.pending.num_rows:
            self._write_row_group(self.pending)
        if self.writer is not None:
            self.writer.close()
        return self.files

    def _write_row_group(self, group: pa.Table) -> None:
        if self.writer is None or self.groups_in_file == self.row_groups_per_file:
            if self.writer is not None:
                self.writer.close()
            path = self.out_dir / f"part-{len(self.files):05d}.parquet"
            self.writer, self.groups_in_file = pq.ParquetWriter(path, self.schema), 0
            self.files.append(path)
        self.writer.write_table(group, row_group_size=group.num_rows)
        self.groups_in_file += 1


def read_jsonl(path: str, columns: list[str] | None) -> pa.Table:
    """One JSON Lines file (compressed by its suffix or not) as a table; ``columns``: only those."""
    try:
        with pa.input_stream(path, compression="detect") as stream:
            table = pj.read_json(stream)
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError(f"convert: cannot read {path}: {exc}") from None
    return _selected(table, columns, path)


def read_webdataset(path: str, columns: list[str] | None) -> pa.Table:
    """One WebDataset shard as a table: a row per sample (consecutive members with one key)."""
    rows: list[dict] = []
    try:
        with tarfile.open(path, mode="r|*") as shard:
            for member in shard:
                if not member.isfile():
                    continue
                folder, _, name = member.name.rpartition("/")
                stem, dot, extension = name.partition(".")
                key = f"{folder}/{stem}" if folder else stem
                if not dot or stem.startswith("_"):  # no extension, or metadata beside the samples
                    continue
                if not rows or rows[-1]["__key__"] != key:
                    rows.append({"__key__": key})
                data = shard.extractfile(member).read()
                rows[-1][extension.lower()] = data.decode("utf-8", "replace") if extension.lower() in TEXT_EXTENSIONS \
                    else data
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ConfigError(f"convert: cannot read WebDataset shard {path}: {exc}") from None
    fields = sorted({k for row in rows for k in row} - {"__key__"})
    table = pa.table({"__key__": pa.array([r["__key__"] for r in rows], pa.string()),
                      **{f: pa.array([r.get(f) for r in rows], pa.string() if f in TEXT_EXTENSIONS else pa.binary())
                         for f in fields}})
    return _selected(table, columns, path)


def _selected(table: pa.Table, columns: list[str] | None, path: str) -> pa.Table:
    if not columns:
        return table
    missing = [c for c in columns if c not in table.schema.names]
    if missing:
        raise ConfigError(f"convert: {path} has no field {missing[0]!r} (fields: {', '.join(table.schema.names)})")
    return table.select(columns)


def read_input(path: str, columns: list[str] | None) -> pa.Table:
    """An input by its name: an MDS dataset (a folder with ``index.json``), a WebDataset shard, else JSON Lines."""
    if mds.is_mds(path):
        return _selected(mds.read_mds(path), columns, path)
    return read_webdataset(path, columns) if path.lower().endswith(TAR_SUFFIXES) else read_jsonl(path, columns)


def input_bytes(path: str) -> int:
    return mds.dataset_bytes(path) if mds.is_mds(path) else os.path.getsize(path)


def convert_files(inputs: list[str], out_dir: str | os.PathLike, *, columns: list[str] | None = None,
                  row_group_bytes: int = ROW_GROUP_BYTES, row_groups_per_file: int = ROW_GROUPS_PER_FILE,
                  progress: bool = True) -> list[Path]:
    """Convert ``inputs`` (in the order given) into Parquet files in ``out_dir``; returns them."""
    if not inputs:
        raise ConfigError("convert: no input files")
    for path in inputs:
        if not os.path.isfile(path) and not mds.is_mds(path):
            raise ConfigError(f"convert: input file not found: {path}" + (
                f" (a folder is read as an MDS dataset when it holds {mds.INDEX})" if os.path.isdir(path) else ""))
    if row_group_bytes < 1 or row_groups_per_file < 1:
        raise ConfigError("convert: --row-group-bytes and --row-groups-per-file must be positive")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("part-*.parquet")):
        raise ConfigError(f"convert: {out} already holds part-*.parquet files: convert into an empty folder")
    converter = Converter(out, row_group_bytes, row_groups_per_file)
    with tqdm(total=sum(map(input_bytes, inputs)), unit="B", unit_scale=True, desc="convert",
              disable=not progress) as bar:
        for path in inputs:
            converter.add(read_input(path, columns), path)
            bar.update(input_bytes(path))
    return converter.close()
