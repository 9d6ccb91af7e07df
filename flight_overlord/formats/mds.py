"""MosaicML Streaming's MDS shards, read for ``overlord convert``: a folder with ``index.json`` and its
``shard.NNNNN.mds`` files (or ``.mds.zstd``, ``.gz``, ``.bz2``, ``.br``: the whole shard compressed).

The layout, as Streaming 0.13 writes it (``streaming/base/format/mds``): a shard is ``uint32`` sample
count n, then n + 1 ``uint32`` offsets of the samples from the shard's start, then the samples. A sample
is one ``uint32`` size per column of variable size (``column_sizes`` null), then each column's bytes, the
columns in ``column_names`` order. The ``mosaicml-streaming`` package pins numpy < 2.2, which our pins do
not allow, so this reads the layout itself; the values become Arrow columns by their encoding (below).
``pkl`` (arbitrary code on load) and image encodings are kept as bytes; ``ndarray`` is read when it is
one-dimensional (token ids: a list column), with its dtype in the encoding or in each sample.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..errors import ConfigError

INDEX = "index.json"
SCALARS = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"}
TEXT = {"str", "json", "str_int", "str_float", "str_decimal"}  # kept as the text the writer made
NDARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32", 33: "int32",
                  34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
COMPRESSIONS = {"zstd": "zstd", "gz": "gzip", "bz2": "bz2", "br": "brotli"}


def is_mds(path: str) -> bool:
    """A folder holding an MDS ``index.json``, or that file."""
    p = Path(path)
    return (p / INDEX).is_file() or (p.name == INDEX and p.is_file())


def dataset_bytes(path: str) -> int:
    """The bytes of the MDS dataset at ``path`` (its folder or ``index.json``): what a progress bar counts."""
    return sum(f.stat().st_size for f in _folder(path).iterdir() if f.is_file())


def _folder(path: str) -> Path:
    return Path(path).parent if Path(path).name == INDEX else Path(path)


def read_mds(path: str) -> pa.Table:
    """Every sample of the MDS dataset at ``path`` (its folder or ``index.json``), shard after shard."""
    folder = _folder(path)
    try:
        shards = json.loads((folder / INDEX).read_text(encoding="utf-8"))["shards"]
        tables = [_read_shard(folder, shard) for shard in shards]
    except (OSError, ValueError, KeyError, TypeError, IndexError, pa.ArrowException) as exc:
        raise ConfigError(f"convert: cannot read MDS dataset {folder}: {exc}") from None
    return pa.concat_tables(tables) if tables else pa.table({})


def _read_shard(folder: Path, shard: dict) -> pa.Table:
    if shard.get("format") != "mds":
        raise ValueError(f"shard format {shard.get('format')!r}, not 'mds'")
    data = _shard_bytes(folder, shard)
    count = int(np.frombuffer(data, np.uint32, 1)[0])
    offsets = np.frombuffer(data, np.uint32, count + 1, 4).astype(np.int64)
    names, encodings, sizes = shard["column_names"], shard["column_encodings"], shard["column_sizes"]
    values: list[list[bytes]] = [[] for _ in names]
    variable = sum(size is None for size in sizes)  # each sample starts with these columns' byte sizes
    for begin, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        sample = memoryview(data)[begin:end]
        heads = np.frombuffer(sample, np.uint32, variable).tolist()
        at, head = 4 * len(heads), iter(heads)
        for column, size in enumerate(sizes):
            size = next(head) if size is None else size
            values[column].append(bytes(sample[at:at + size]))
            at += size
    return pa.table({name: _column(encoding, column, name) for name, encoding, column in zip(names, encodings, values)})


def _shard_bytes(folder: Path, shard: dict) -> bytes:
    """The shard's raw bytes: its ``raw_data`` file, else its ``zip_data`` file decompressed."""
    raw = folder / shard["raw_data"]["basename"]
    if raw.is_file() or not shard.get("zip_data"):
        return raw.read_bytes()
    algorithm = str(shard.get("compression") or "").split(":")[0]
    if algorithm not in COMPRESSIONS:
        raise ValueError(f"compression {shard.get('compression')!r} (readable: {', '.join(COMPRESSIONS)})")
    with pa.input_stream(str(folder / shard["zip_data"]["basename"]), compression=COMPRESSIONS[algorithm]) as f:
        return f.read()


def _column(encoding: str, values: list[bytes], name: str) -> pa.Array:
    """One column's encoded values as an Arrow array."""
    kind, _, spec = encoding.partition(":")
    if kind in SCALARS:
        return pa.array(np.frombuffer(b"".join(values), np.dtype(kind)))
    if kind == "int":
        return pa.array(np.frombuffer(b"".join(values), np.int64))
    if kind in TEXT:
        return pa.array([v.decode("utf-8") for v in values], pa.string())
    if kind == "ndarray":
        arrays = [_ndarray(v, spec, name) for v in values]
        return pa.array(arrays, pa.list_(pa.from_numpy_dtype(arrays[0].dtype))) if arrays else pa.array([], pa.null())
    return pa.array(values, pa.binary())  # bytes, pkl, pil, jpeg, png...: as written


def _ndarray(data: bytes, spec: str, name: str) -> np.ndarray:
    """A one-dimensional ``ndarray`` value: ``[dtype: 1]`` unless the encoding names it, ``[ndim << 2 |
    shape dtype: 1][shape]`` unless it names the shape, then the values."""
    dtype, _, shape = spec.partition(":")
    at = 0
    if not dtype:
        dtype, at = NDARRAY_DTYPES[data[0]], 1
    if not shape:
        ndim, width = data[at] >> 2, 1 << (data[at] & 3)
        if ndim != 1:
            raise ValueError(f"column {name!r}: an ndarray of {ndim} dimensions (convert reads 1)")
        at += 1 + ndim * width
    elif "," in shape:
        raise ValueError(f"column {name!r}: an ndarray of shape {shape} (convert reads 1 dimension)")
    return np.frombuffer(data, np.dtype(dtype), offset=at)
