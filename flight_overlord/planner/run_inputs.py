"""What a run journals once, not per step, so that its steps can be re-derived (``replay.py``): the
config of every start with the row groups its loaders registered, and the row groups a loader could
not read when they were planned."""
from __future__ import annotations

import json
from pathlib import Path

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
        write_json_atomic(self.path, value)


class Unreadable:
    """Row groups whose loader could not read them when they were planned (``planner/unreadable.json``):
    an input no file gives afterwards (a read may fail one day and not the next), so a replay plans
    them as unreadable again. Written once per such row group, not per step."""

    def __init__(self, path: Path):
        self.path = path
        self._known = {tuple(x) for x in json.loads(path.read_text())} if path.exists() else set()

    def watched(self, source: str, fetch: FetchMeta) -> FetchMeta:
        """``fetch``, noting every row group it answers with no readable row."""
        def meta(epoch: int, rg: RowGroupRef) -> dict:
            answer = fetch(epoch, rg)
            key = (source, epoch, rg.file, rg.row_group)
            if rg.num_rows and key not in self._known and (np.asarray(answer["num_tokens"]) < 0).all():
                self._known.add(key)
                write_json_atomic(self.path, sorted(self._known))
            return answer
        return meta

    def applied(self, source: str, fetch: FetchMeta) -> FetchMeta:
        """``fetch``, with the row groups noted unreadable answered as a failed read."""
        def meta(epoch: int, rg: RowGroupRef) -> dict:
            if (source, epoch, rg.file, rg.row_group) in self._known:
                return {"num_tokens": np.full(rg.num_rows, -1, dtype=np.int64),  # as a loader's failed read
                        "image_patches": np.zeros(rg.num_rows, dtype=np.int64), "image_sizes": [()] * rg.num_rows}
            return fetch(epoch, rg)
        return meta


class ConfigHistory:
    """The config of every start of a run (``planner/configs.json``: the journal offset it planned
    from, its folder and its YAML as data), so a step is re-derived with the config it was planned
    with, across resumes on an edited mixture or another layout. One entry per start, not per step."""

    def __init__(self, path: Path):
        self.path = path
        self._file = JsonFile(path, [])
        self._built: dict[int, tuple[Config, object]] = {}
        self._current: tuple[str, object] | None = None

    def entries(self) -> list[dict]:
        return self._file.read()

    def note(self, cfg: Config, offset: int) -> None:
        """The config ``cfg`` plans from journal offset ``offset`` on (kept when it differs from the last)."""
        if cfg.path is None:
            return
        entry = {"offset": offset, "base_dir": str(Path(cfg.path).parent), "raw": yaml.safe_load(Path(cfg.path).read_text())}
        entries = self.entries()
        if entries and (entries[-1]["base_dir"], entries[-1]["raw"]) == (entry["base_dir"], entry["raw"]):
            return
        self._file.write(entries + [entry])

    def note_row_groups(self, row_groups: dict[str, list[RowGroupRef]]) -> None:
        """Every source's row groups as its loaders registered them, with the latest start's config: a
        file gone since (deleted mid-run, say) leaves the read order an offline replay follows as it was."""
        entries = self.entries()
        listed = {name: [[rg.file, rg.row_group, rg.num_rows] for rg in rgs] for name, rgs in row_groups.items()}
        if entries and entries[-1].get("row_groups") != listed:
            self._file.write([*entries[:-1], {**entries[-1], "row_groups": listed}])

    def entry_at(self, offset: int) -> tuple[int, dict | None]:
        """(index, entry) of the start whose config planned the record at ``offset``; (-1, None): none known."""
        entries = [e for e in self.entries() if e["offset"] <= offset]
        return len(entries) - 1, (entries[-1] if entries else None)

    def at(self, offset: int, current: Config) -> tuple[Config, object] | None:
        """(config, strategy) in force for a record at ``offset``; None when it is ``current``'s (or unknown)."""
        entries = [e for e in self.entries() if e["offset"] <= offset]
        if not entries or current.path is None:
            return None
        entry = entries[-1]
        if self._current is None:  # read once: the file may be edited for the next resume meanwhile
            self._current = (str(Path(current.path).parent), yaml.safe_load(Path(current.path).read_text()))
        if (entry["base_dir"], entry["raw"]) == self._current:
            return None
        key = len(entries) - 1
        if key not in self._built:
            from ..config.parse import parse_config, with_partition_plan
            from .strategy import load_strategy
            cfg = with_partition_plan(parse_config(entry["raw"], base_dir=Path(entry["base_dir"])))
            self._built[key] = (cfg, load_strategy(cfg, cfg.mesh))
        return self._built[key]
