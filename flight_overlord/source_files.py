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
import hashlib
import os
import re
import stat
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .errors import OverlordError


class StorageError(OverlordError, OSError):
    """A source file or folder that cannot be listed or opened; the message names it."""


def is_uri(path: str) -> bool:
    return "://" in str(path)


def display(path: str) -> str:
    """A file as logs and errors show it: a URI without its query string (which may hold secrets)."""
    if not is_uri(path):
        return str(path)
    parts = urlsplit(str(path))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


# The environment variables a file system reads its credentials from: a change (rotated keys) opens a new one.
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                  "AWS_SHARED_CREDENTIALS_FILE", "GOOGLE_APPLICATION_CREDENTIALS")


def _credentials_fingerprint() -> str:
    """A digest of the credential variables (never the values themselves in a cache key)."""
    return hashlib.sha256("\0".join(os.environ.get(k, "") for k in CREDENTIAL_ENV).encode()).hexdigest()


@functools.lru_cache(maxsize=64)
def _cached_filesystem(scheme: str, netloc: str, query: str, credentials: str) -> pafs.FileSystem:
    return pafs.FileSystem.from_uri(urlunsplit((scheme, netloc, "/", query, "")))[0]


def _filesystem(scheme: str, netloc: str, query: str) -> pafs.FileSystem:
    return _cached_filesystem(scheme, netloc, query, _credentials_fingerprint())


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


def file_states(paths: list[str]) -> list[tuple[int, int]]:
    """(size in bytes, modification time in ns) of every file of ``paths``: a stat per local file; for
    URIs one listing per folder (a LIST on object storage, not a request per file). Errors name the file."""
    states: dict[str, tuple[int, int]] = {}
    folders: dict[tuple, list[str]] = {}
    for path in paths:
        if is_uri(path):
            parts = urlsplit(path)
            folders.setdefault((parts.scheme, parts.netloc, parts.query, parts.path.rsplit("/", 1)[0]), []).append(path)
            continue
        try:
            st = os.stat(path)
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror}") from None
        states[path] = (st.st_size, st.st_mtime_ns)
    for (scheme, netloc, query, folder), members in folders.items():
        fs, inner = resolve(urlunsplit((scheme, netloc, folder + "/", query, "")))
        try:
            listed = {info.path.rstrip("/").rsplit("/", 1)[-1]: info
                      for info in fs.get_file_info(pafs.FileSelector(inner.rstrip("/"), allow_not_found=True))}
        except (pa.ArrowException, OSError) as exc:
            raise StorageError(f"cannot list {display(members[0]).rsplit('/', 1)[0]}: {exc}") from None
        for path in members:
            info = listed.get(urlsplit(path).path.rsplit("/", 1)[-1])
            if info is None or info.type != pafs.FileType.File:
                raise StorageError(f"cannot read {display(path)}: not found")
            states[path] = (info.size, info.mtime_ns or 0)
    return [states[p] for p in paths]


def local_matches(pattern: str) -> tuple[list[str], list[str]]:
    """(files, folders) a local path or glob names: the files each as ``Path.resolve()`` makes it
    (symlinks followed), sorted; the folders as ``glob`` gives them. A folder is resolved once for all
    its files, not once per file (a resolve costs a syscall per path component), and a glob in the file
    name alone (``dir/*.parquet``) reads the folder's entries once, their types with them (no ``stat``
    per file)."""
    folder, name = os.path.split(pattern)
    if glob.has_magic(name) and not glob.has_magic(folder) and "**" not in name:
        return _matches_in(folder, name)
    real: dict[str, str] = {}
    files, folders = [], []
    for match in glob.glob(pattern, recursive=True):
        try:
            mode = os.lstat(match).st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode):
            parent, name = os.path.split(match)
            if parent not in real:
                real[parent] = str(Path(parent or ".").resolve())
            files.append(os.path.join(real[parent], name))
        elif os.path.isfile(match):  # a link to a file
            files.append(str(Path(match).resolve()))
        elif os.path.isdir(match):
            folders.append(match)
    return sorted(files), sorted(folders)


def _matches_in(folder: str, name_pattern: str) -> tuple[list[str], list[str]]:
    """``local_matches`` of ``folder/name_pattern``: the matches ``glob`` gives (names starting with a
    dot only when the pattern does)."""
    match = re.compile(fnmatch.translate(name_pattern)).match
    hidden = name_pattern.startswith(".")
    try:
        entries = os.scandir(folder or ".")
    except OSError:
        return [], []
    real = str(Path(folder or ".").resolve())
    files, folders = [], []
    with entries:
        for entry in entries:
            if (entry.name.startswith(".") and not hidden) or not match(entry.name):
                continue
            if entry.is_file(follow_symlinks=False):
                files.append(os.path.join(real, entry.name))
            elif entry.is_file():  # a link to a file
                files.append(str(Path(entry.path).resolve()))
            elif entry.is_dir():
                folders.append(entry.path)
    return sorted(files), sorted(folders)


def has_magic(pattern: str) -> bool:
    return glob.has_magic(urlsplit(pattern).path if is_uri(pattern) else pattern)


def parquet_file(path: str, **options) -> pq.ParquetFile:
    """Open a Parquet file, local or remote; errors name the file (without a URI's query string)."""
    fs, inner = resolve(path)
    try:
        return pq.ParquetFile(inner, filesystem=fs, **options) if fs else pq.ParquetFile(inner, **options)
    except (pa.ArrowException, OSError) as exc:
        raise StorageError(f"cannot open Parquet file {display(path)}: {exc}") from None


def join(uri: str, *parts: str) -> str:
    """``uri`` (a folder) with ``parts`` appended to its path, its query string kept."""
    p = urlsplit(uri)
    return urlunsplit((p.scheme, p.netloc, "/".join([p.path.rstrip("/"), *parts]), p.query, ""))


def check_destination(uri: str) -> None:
    """Fail fast (before making anything to upload) when the bucket or top folder of ``uri`` is missing
    or cannot be reached: a StorageError names ``uri`` without its query string."""
    fs, inner = resolve(uri)
    if fs is None:
        raise StorageError(f"not a URI: {uri}")
    top = inner.strip("/").split("/", 1)[0]
    try:
        found = fs.get_file_info(top).type != pafs.FileType.NotFound
    except (pa.ArrowException, OSError) as exc:
        raise StorageError(f"cannot write to {display(uri)}: {exc}") from None
    if not found:
        raise StorageError(f"cannot write to {display(uri)}: {top!r} does not exist")


def upload_tree(local: str | os.PathLike, uri: str) -> list[str]:
    """Copy every file under the folder ``local`` to the folder ``uri`` (same relative paths), replacing
    files of the same names and removing ``part-*.parquet`` files beside them that ``local`` lacks (so an
    earlier, larger corpus does not mix in). Returns the written URIs; errors name ``uri`` without its
    query string."""
    local = Path(local)
    files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    fs, root = resolve(uri)
    if fs is None:
        raise StorageError(f"not a URI: {uri}")
    root = root.rstrip("/")
    try:
        for folder in sorted({f.rsplit("/", 1)[0] for f in files if "/" in f}):
            stale = set(expand(join(uri, folder, "part-*.parquet"))) - {join(uri, f) for f in files}
            for path in sorted(stale):
                fs.delete_file(resolve(path)[1])
        for f in files:
            with open(local / f, "rb") as src, fs.open_output_stream(f"{root}/{f}") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
    except (pa.ArrowException, OSError) as exc:
        raise StorageError(f"cannot write to {display(uri)}: {exc}") from None
    return [join(uri, f) for f in files]
