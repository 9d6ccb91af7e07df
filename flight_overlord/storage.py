"""Where source files live: local paths, or URIs opened with ``pyarrow.fs`` (``s3://``, ``gs://``,
``hdfs://``, ``file://``).

A URI's query string (``?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1``) is
honoured by ``FileSystem.from_uri``; credentials come from the storage's standard environment
variables (for S3, ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``). A glob in the path is
expanded with a ``FileSelector``. Query strings can hold secrets, so logs and errors show a file by
:func:`display`, which drops them.
"""
from __future__ import annotations

import fnmatch
import functools
import glob
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


class StorageError(OSError):
    """A source file or folder that cannot be listed or opened; the message names it."""


def is_uri(path: str) -> bool:
    return "://" in str(path)


def display(path: str) -> str:
    """A file as logs and errors show it: a URI without its query string (which may hold secrets)."""
    if not is_uri(path):
        return str(path)
    parts = urlsplit(str(path))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


@functools.lru_cache(maxsize=64)
def _filesystem(scheme: str, netloc: str, query: str) -> pafs.FileSystem:
    return pafs.FileSystem.from_uri(urlunsplit((scheme, netloc, "/", query, "")))[0]


def resolve(path: str) -> tuple[pafs.FileSystem | None, str]:
    """(file system, path inside it) of a URI; (None, path) for a local path."""
    if not is_uri(path):
        return None, str(path)
    parts = urlsplit(str(path))
    try:
        fs = _filesystem(parts.scheme, parts.netloc, parts.query)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise StorageError(f"cannot open the file system of {display(path)}: {exc}") from None
    inner = f"{parts.netloc}{parts.path}" if parts.scheme in ("s3", "gs", "gcs") else parts.path
    return fs, inner


def expand(pattern: str) -> list[str]:
    """The files a URI (or URI glob) names, as URIs with the pattern's query string kept, sorted."""
    parts = urlsplit(pattern)
    fs, inner = resolve(pattern)
    magic = next((i for i, ch in enumerate(inner) if ch in "*?["), None)
    try:
        if magic is None:
            info = fs.get_file_info(inner)
            if info.type == pafs.FileType.NotFound:
                return []
            matches = [inner] if info.type == pafs.FileType.File else []
        else:
            base = inner[:magic].rsplit("/", 1)[0]
            infos = fs.get_file_info(pafs.FileSelector(base, recursive="**" in inner or "/" in inner[magic:],
                                                       allow_not_found=True))
            matches = [i.path for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatch(i.path, inner)]
    except (pa.ArrowException, OSError) as exc:
        raise StorageError(f"cannot list {display(pattern)}: {exc}") from None
    prefix = f"{parts.netloc}" if parts.scheme in ("s3", "gs", "gcs") else ""
    return sorted(urlunsplit((parts.scheme, parts.netloc, m[len(prefix):] if prefix and m.startswith(prefix) else m,
                              parts.query, "")) for m in matches)


def has_magic(pattern: str) -> bool:
    return glob.has_magic(urlsplit(pattern).path if is_uri(pattern) else pattern)


def parquet_file(path: str, **options) -> pq.ParquetFile:
    """Open a Parquet file, local or remote; errors name the file (without a URI's query string)."""
    fs, inner = resolve(path)
    try:
        return pq.ParquetFile(inner, filesystem=fs, **options) if fs else pq.ParquetFile(inner, **options)
    except (pa.ArrowException, OSError) as exc:
        raise StorageError(f"cannot open Parquet file {display(path)}: {exc}") from None
