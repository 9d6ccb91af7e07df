"""Durable run state under ``run_dir``: append-only journals and step-numbered snapshots.

A journal is JSON lines, appended and flushed (and fsync'd when asked) as written; a torn last
line (a crash mid-write) is tolerated and skipped on read. A snapshot is one JSON file written
atomically (temporary file, then rename) whose name carries the step it was taken at, plus the
journal offset it covers, so a restore reads one snapshot and the journal tail after it: restore
cost does not grow with the step number.

A journal may be compacted (``Journal.compact``): the records before an offset move to
``<name>.archive`` and the file keeps the tail, headed by a line giving the offset it starts at.
Offsets stay those of the whole journal (archive + tail), so a snapshot's offset never changes;
``read_journal`` reads across both, while a restore reads the tail only: the file a restarted
role reads is bounded however long the run.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
from pathlib import Path
from typing import Callable, Iterator

log = logging.getLogger(__name__)
BASE = "journal_base"  # the first line of a compacted journal: the offset its tail starts at


class Journal:
    """Append-only JSON lines. Several processes may append to one file (O_APPEND, one write per line)."""

    def __init__(self, path: Path, *, fsync: bool = False, guard: Callable[[], None] | None = None):
        """``guard``: called before every record is written; raises (or ends the process) when this
        process may no longer write here (``fence.Fence.enforce``)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fsync = fsync
        self.guard = guard
        self._lock = threading.Lock()  # an append never races a compaction
        self._open()

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        with self.path.open("rb") as f:
            self._base, self._header = _base(f)
            end = f.seek(0, os.SEEK_END)
            f.seek(max(0, end - 1))
            torn = end > 0 and f.read(1) != b"\n"
        if torn:  # a crash mid-write left half a line: end it (read as corrupt), or the next record joins it
            os.write(self._fd, b"\n")

    def append(self, record: dict, *, durable: bool = True) -> int:
        """Write one record; returns the offset just past it. ``durable=False``: not fsync'd now (a record
        that can be derived again): it survives its process's death, and the next durable record or
        ``sync`` makes it durable with everything before it (the file is append-only)."""
        if self.guard is not None:
            self.guard()
        with self._lock:
            os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
            if self.fsync and durable:
                os.fsync(self._fd)
            return self._end()

    def size(self) -> int:
        with self._lock:
            return self._end()

    def synced_size(self) -> int:
        """``sync`` then ``size`` as one: an offset an OS crash cannot take back (the records before it
        are durable), for a note kept outside the journal that names it."""
        with self._lock:
            os.fsync(self._fd)
            return self._end()

    @property
    def start(self) -> int:
        """The offset the file starts at (0 until compacted)."""
        return self._base

    def _end(self) -> int:
        return self._base + os.lseek(self._fd, 0, os.SEEK_END) - self._header

    def compact(self, before: int) -> int:
        """Move the records before offset ``before`` (a record boundary, as ``append`` returns) to the
        archive; returns the bytes moved. A crash midway leaves a readable journal: the archive is
        written (and cut back to the old start first) before the tail replaces the file."""
        with self._lock:
            if before <= self._base:
                return 0
            archive = archive_path(self.path)
            with self.path.open("rb") as f:
                f.seek(self._header)
                moved, tail = f.read(before - self._base), f.read()
            with archive.open("ab") as out:
                out.truncate(self._base)
                out.write(moved)
                out.flush()
                os.fsync(out.fileno())
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            with tmp.open("wb") as out:
                out.write((json.dumps({BASE: before}) + "\n").encode() + tail)
                out.flush()
                os.fsync(out.fileno())
            tmp.replace(self.path)
            os.close(self._fd)
            self._open()
            return len(moved)

    def close(self) -> None:
        os.close(self._fd)


def journal_size(path: Path) -> int:
    """A journal's size in offsets (archive and file together): what ``Journal.size`` says."""
    if not path.exists():
        return 0
    with path.open("rb") as f:
        base, header = _base(f)
    return base + path.stat().st_size - header


def archive_path(path: Path) -> Path:
    return path.with_name(path.name + ".archive")


def _base(f) -> tuple[int, int]:
    """(the offset a journal's file starts at, the bytes of its heading line): (0, 0) when never compacted."""
    f.seek(0)
    first = f.readline()
    if first.startswith(b'{"' + BASE.encode()) and first.endswith(b"\n"):
        return int(json.loads(first)[BASE]), len(first)
    return 0, 0


def read_journal(path: Path, offset: int = 0) -> Iterator[tuple[int, dict]]:
    """(offset past the record, record) from ``offset`` on, from the archive first when the journal
    was compacted past ``offset``; a torn or corrupt line is skipped with a warning (only a crash
    mid-write makes one, and it can only be the last)."""
    if not path.exists():
        return
    with path.open("rb") as f:
        base, header = _base(f)
        if offset < base and archive_path(path).exists():
            with archive_path(path).open("rb") as archived:
                archived.seek(offset)
                yield from _lines(path, archived, offset, limit=base)
        offset = max(offset, base)
        f.seek(offset - base + header)
        yield from _lines(path, f, offset)


def _lines(path: Path, f, offset: int, limit: int | None = None) -> Iterator[tuple[int, dict]]:
    """The records of ``f`` from where it is (journal offset ``offset``) to ``limit`` (the end: None)."""
    for line in f:
        if limit is not None and offset >= limit:
            return
        offset += len(line)
        if not line.endswith(b"\n"):
            log.warning("%s: ignoring a torn last line (%d bytes): the writer died mid-write", path, len(line))
            return
        try:
            yield offset, json.loads(line)
        except json.JSONDecodeError:
            log.warning("%s: ignoring a corrupt line at offset %d", path, offset - len(line))


class Snapshots:
    """``<dir>/<name>-<step>.json`` files, written atomically; the latest at or before a step is found
    from the file names alone. Old ones are pruned: the newest ``keep`` stay and, when ``bucket`` is
    given, the first one of every ``bucket`` steps before them, so a resume at an old step still finds
    a snapshot at most ``bucket`` steps before it while the folder grows that much slower than the run."""

    def __init__(self, directory: Path, name: str, *, keep: int = 4, bucket: int | None = None):
        self.directory = directory
        self.name = name
        self.keep, self.bucket = keep, bucket
        self._pattern = re.compile(rf"^{re.escape(name)}-(\d+)\.json$")
        self._written = 0

    def write(self, step: int, state: dict) -> Path:
        path = self._write(step, state)
        self._written += 1
        if self._written % self.keep == 0:
            self._prune()
        return path

    def _prune(self) -> None:
        seen: set[int] = set()
        for step in self.steps()[:-self.keep]:
            if self.bucket is not None and step // self.bucket not in seen:
                seen.add(step // self.bucket)  # the first snapshot of its bucket stays
                continue
            (self.directory / f"{self.name}-{step:09d}.json").unlink(missing_ok=True)

    def _write(self, step: int, state: dict) -> Path:
        path = self.directory / f"{self.name}-{step:09d}.json"
        write_json_atomic(path, state, durable=True)
        return path

    def steps(self) -> list[int]:
        # listed at each call, not kept: an operator may prune old snapshots of a live run by hand
        if not self.directory.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := self._pattern.match(p.name)))

    def latest(self, at_most: int | None = None) -> tuple[int, dict] | None:
        """The newest readable snapshot taken at or before ``at_most`` (any, when None)."""
        for step in reversed(self.steps()):
            if at_most is not None and step > at_most:
                continue
            path = self.directory / f"{self.name}-{step:09d}.json"
            try:
                return step, json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:  # a snapshot is written atomically; be safe anyway
                log.warning("unreadable snapshot %s (%s); trying an older one", path, exc)
        return None


def write_json_atomic(path: Path, obj, *, durable: bool = False) -> None:
    write_text_atomic(path, json.dumps(obj, separators=(",", ":")), durable=durable)


def write_text_atomic(path: Path, text: str, *, durable: bool = False) -> None:
    write_bytes_atomic(path, text.encode(), durable=durable)


def write_bytes_atomic(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Write ``path`` whole (a temporary file, then rename): a reader sees the old or the new bytes.
    ``durable``: also fsync'd, the file then its folder (the rename), so an OS crash keeps it, for a
    file that names journal offsets whose records may survive the crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with tmp.open("wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    tmp.replace(path)
    if durable:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
