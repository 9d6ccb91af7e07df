"""Durable run state under ``run_dir``: append-only journals and step-numbered snapshots.

A journal is JSON lines, appended and flushed (and fsync'd when asked) as written; a torn last
line (a crash mid-write) is tolerated and skipped on read. A snapshot is one JSON file written
atomically (temporary file, then rename) whose name carries the step it was taken at, plus the
journal offset it covers, so a restore reads one snapshot and the journal tail after it: restore
cost does not grow with the step number.
"""
from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)


class Journal:
    """Append-only JSON lines. Several processes may append to one file (O_APPEND, one write per line)."""

    def __init__(self, path: Path, *, fsync: bool = False):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fsync = fsync
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, record: dict) -> int:
        """Write one record; returns the file offset just past it."""
        os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        if self.fsync:
            os.fsync(self._fd)
        return os.lseek(self._fd, 0, os.SEEK_END)

    def size(self) -> int:
        return os.lseek(self._fd, 0, os.SEEK_END)

    def close(self) -> None:
        os.close(self._fd)


def read_journal(path: Path, offset: int = 0) -> Iterator[tuple[int, dict]]:
    """(offset past the record, record) from ``offset`` on; a torn or corrupt line is skipped with a
    warning (only a crash mid-write makes one, and it can only be the last)."""
    if not path.exists():
        return
    with path.open("rb") as f:
        f.seek(offset)
        for line in f:
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
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.name}-{step:09d}.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with tmp.open("w") as f:
            json.dump(state, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
        return path

    def steps(self) -> list[int]:
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


def write_json_atomic(path: Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, separators=(",", ":")))


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)
