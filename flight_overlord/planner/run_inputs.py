"""What a run journals once, not per step, so that its steps can be re-derived (``replay.py``): the
config of every start with the catalogs its loaders registered (digests), and the row groups a loader
could not read when they were planned."""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from ..config import Config
from ..core.order import RowGroupRef
from ..journal import write_json_atomic
from .feed import FetchMeta


class JsonFile:
    """A small JSON file of the run (written atomically: a new file each time), parsed again only when
    it changed: replaying a journal asks for it once per step, which must not read it once per step."""

    def __init__(self, path: Path, default):
        self.path, self.default = path, default
        self._seen: tuple | None = None  # (inode, mtime, size) of the file parsed last
        self._value = default

    def read(self):
        """The file's value (``default`` while there is none); treat it as read-only."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return self.default
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if seen != self._seen:
            self._value, self._seen = json.loads(self.path.read_text()), seen
        return self._value

    def write(self, value) -> None:
        write_json_atomic(self.path, value, durable=True)  # names journal offsets: kept as the records are


class Unreadable:
    """Row groups whose loader could not read them when they were planned (``planner/unreadable.json``),
    each with the journal offsets its failure held for: an input no file gives afterwards (a read may
    fail one day and not the next), so a replay plans them as unreadable again, but only for the records
    planned from that failure. A note opens at the journal's synced size when a fetch fails and closes at a later
    good fetch of the same row group (after a restart, or a rewind, that plans its steps again); a record
    at offset o was planned from a failed read iff a note's [opened, closed) holds o. Written once per
    change, not per step. Entries: [source, epoch, file, row group, opened, closed or None]."""

    def __init__(self, path: Path):
        self.path = path
        self._notes: dict[tuple, list[list]] = {}  # (source, epoch, file, row group) -> [[opened, closed], ...]
        self._lock = threading.Lock()  # planning notes while serving threads replay
        for entry in json.loads(path.read_text()) if path.exists() else []:
            opened, closed = entry[4:6] if len(entry) > 4 else (0, None)  # a file of before: always unreadable
            self._notes.setdefault(tuple(entry[:4]), []).append([opened, closed])

    def watched(self, source: str, fetch: FetchMeta, offset: Callable[[], int]) -> FetchMeta:
        """``fetch``, noting where a row group's read starts or stops failing (``offset()``: the journal's
        size once synced, an offset an OS crash cannot take back)."""
        def meta(epoch: int, rg: RowGroupRef) -> dict:
            answer = fetch(epoch, rg)
            if rg.num_rows:
                key = (source, epoch, rg.file, rg.row_group)
                if bool((np.asarray(answer["num_tokens"]) < 0).all()) != self._open(key):
                    self._toggle(key, offset())
            return answer
        return meta

    def applied(self, source: str, fetch: FetchMeta, offset: int) -> FetchMeta:
        """``fetch`` for the record at journal offset ``offset``: the row groups noted unreadable there
        answered as a failed read."""
        def meta(epoch: int, rg: RowGroupRef) -> dict:
            if self.failed_at((source, epoch, rg.file, rg.row_group), offset):
                return {"num_tokens": np.full(rg.num_rows, -1, dtype=np.int64),  # as a loader's failed read
                        "image_patches": np.zeros(rg.num_rows, dtype=np.int64), "image_sizes": [()] * rg.num_rows}
            return fetch(epoch, rg)
        return meta

    def failed_at(self, key: tuple, offset: int) -> bool:
        with self._lock:
            return any(opened <= offset and (closed is None or offset < closed)
                       for opened, closed in self._notes.get(key, ()))

    def _open(self, key: tuple) -> bool:
        notes = self._notes.get(key)
        return bool(notes) and notes[-1][1] is None

    def _toggle(self, key: tuple, offset: int) -> None:
        """Open a note on ``key`` at ``offset``, or close its open one there (gone when it holds no record)."""
        with self._lock:
            notes = self._notes.setdefault(key, [])
            if notes and notes[-1][1] is None:
                notes[-1][1] = offset
                if notes[-1][0] >= offset:
                    notes.pop()
            else:
                notes.append([offset, None])
            write_json_atomic(self.path, [[*k, *n] for k in sorted(self._notes) for n in self._notes[k]],
                              durable=True)  # before the step record planned from it (that one may survive a crash)


class ConfigHistory:
    """The config of every start of a run (``planner/configs.json``: the journal offset it planned
    from, its folder and its YAML as data), so a step is re-derived with the config it was planned
    with, across resumes on an edited mixture or another layout. One entry per start, not per step.
    ``current``: this start's config, its YAML read now (the file may be edited for the next resume
    meanwhile)."""

    def __init__(self, path: Path, current: Config):
        self.path = path
        self._file = JsonFile(path, [])
        self._built: dict[int, tuple[Config, object]] = {}
        self._current = None if current.path is None else \
            (str(Path(current.path).parent), yaml.safe_load(Path(current.path).read_text()))

    def entries(self) -> list[dict]:
        return self._file.read()

    def note(self, offset: int) -> None:
        """This start's config plans from journal offset ``offset`` on (kept when it differs from the last)."""
        if self._current is None:
            return
        entries = self.entries()
        if entries and (entries[-1]["base_dir"], entries[-1]["raw"]) == self._current:
            return
        base_dir, raw = self._current
        self._file.write(entries + [{"offset": offset, "base_dir": base_dir, "raw": raw}])

    def note_catalogs(self, catalogs: dict[str, str]) -> None:
        """The digest of every source's catalog as its loaders registered it, with the latest start's
        config: a file gone since (deleted mid-run, say) leaves the read order an offline replay follows
        as it was (``source_catalog.cached_catalog``). A digest, not the row groups: what a start writes
        does not grow with the corpus."""
        entries = self.entries()
        if entries and entries[-1].get("catalogs") != catalogs:
            self._file.write([*entries[:-1], {**entries[-1], "catalogs": catalogs}])

    def at(self, offset: int) -> tuple[int, dict | None, tuple[Config, object] | None]:
        """(index, entry) of the start whose config planned the record at ``offset`` ((-1, None): none
        known), and that config with its strategy, None when it is this start's (or unknown)."""
        entries = self.entries()
        # The last start (by position) noted at or before it: after an OS crash a later start may note a
        # smaller offset than the one before it (the journal lost its unsynced tail), so not a count.
        index = max((i for i, e in enumerate(entries) if e["offset"] <= offset), default=-1)
        if index < 0:
            return index, None, None
        entry = entries[index]
        if self._current is None or (entry["base_dir"], entry["raw"]) == self._current:
            return index, entry, None
        if index not in self._built:
            from ..config.parse import parse_config, with_partition_plan
            from .strategy import load_strategy
            cfg = with_partition_plan(parse_config(entry["raw"], base_dir=Path(entry["base_dir"])))
            self._built[index] = (cfg, load_strategy(cfg, cfg.mesh))
        return index, entry, self._built[index]
