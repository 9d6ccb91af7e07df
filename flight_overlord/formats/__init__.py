"""A source's files as catalogs of chunks, whatever their format: one small interface, ``ChunkFile``.

A chunk is the unit a loader reads at once and a sample key names (``source:file:chunk:row``):

- ``parquet``: a row group (``pyarrow.parquet``);
- ``arrow``: a record batch of an Arrow IPC file (``.arrow``, ``.feather`` v2) or of an IPC *stream*
  file, the layout of a Hugging Face ``datasets`` cache or ``save_to_disk`` folder; a stream has no
  footer, so it is indexed by one scan of its messages (``arrow_ipc.py``);
- ``megatron``: a run of sequences of a Megatron-LM indexed dataset (``.bin`` + ``.idx``), whose one
  column is ``input_ids`` (``megatron.py``).

A source's ``format`` is one of ``FORMATS``, or ``auto`` (the default): each file's from its name
(``format_of``). Every reader is pyarrow's own; this module only chooses one and names the file in errors.
"""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .. import source_files
from .arrow_ipc import ArrowIpcFile, ArrowStreamFile, is_ipc_file
from .base import ChunkFile
from .megatron import MegatronIndexed
from .parquet import ParquetChunks

FORMATS = ("parquet", "arrow", "megatron")
LABELS = {"parquet": "Parquet", "arrow": "Arrow IPC", "megatron": "Megatron indexed"}
ARROW_SUFFIXES = (".arrow", ".feather", ".ipc", ".arrows")
HF_STATE = "state.json"  # a Hugging Face datasets folder (save_to_disk): its data files, in order

__all__ = ["FORMATS", "ChunkFile", "format_of", "open_chunks", "read_schema", "directory_files"]


def format_of(path: str, configured: str = "auto") -> str:
    """The format of one file: the source's ``format``, or, for ``auto``, from the file's name
    (``.arrow``/``.feather``/``.ipc``: arrow; ``.bin``: megatron; anything else: parquet, as before
    formats had a name)."""
    if configured != "auto":
        return configured
    name = source_files.display(path).lower()
    return "arrow" if name.endswith(ARROW_SUFFIXES) else "megatron" if name.endswith(".bin") else "parquet"


def open_chunks(path: str, configured: str = "auto", **parquet_options) -> ChunkFile:
    """Open one file of a source as a catalog of chunks; a StorageError names the file (not a URI's query).
    ``parquet_options`` go to ``pq.ParquetFile`` (the loader's ``pre_buffer``, checksum verification)."""
    fmt = format_of(path, configured)
    fs, inner = source_files.resolve(path)
    try:
        if fmt == "parquet":
            return ParquetChunks(pq.ParquetFile(inner, filesystem=fs, **parquet_options))
        if fmt == "megatron":
            if fs is not None:
                raise ValueError("Megatron indexed datasets are read from local files only")
            return MegatronIndexed(inner)
        handle = fs.open_input_file(inner) if fs else pa.memory_map(inner, "r")  # local: reads are views
        try:
            return ArrowIpcFile(handle) if is_ipc_file(handle) else ArrowStreamFile(handle)
        except BaseException:
            handle.close()
            raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise source_files.StorageError(f"cannot read {LABELS[fmt]} file {source_files.display(path)}: {exc}") from None


def read_schema(path: str, configured: str = "auto") -> pa.Schema:
    """The Arrow schema of one file, from its footer (Parquet, IPC file) or first message (IPC stream):
    what a check before start-up needs, without reading any data."""
    with open_chunks(path, configured) as opened:
        return opened.schema


def directory_files(folder: Path) -> list[str]:
    """The data files of a folder named as a source's path: a Hugging Face ``datasets`` folder's
    (``state.json``'s ``_data_files``, in their order), else its ``*.arrow`` and ``*.parquet`` files."""
    state = folder / HF_STATE
    if state.is_file():
        try:
            names = [entry["filename"] for entry in json.loads(state.read_text(encoding="utf-8"))["_data_files"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise source_files.StorageError(f"{state}: not a Hugging Face datasets state file ({exc})") from None
        return [str((folder / name).resolve()) for name in names]
    return sorted(str(p.resolve()) for pattern in ("*.arrow", "*.parquet") for p in folder.glob(pattern) if p.is_file())
