"""A step's drawn samples: one ``Pick`` per sample where a caller wants objects, or a ``PickTable``
of columns, which is what planning works on (an object per sample was most of a step's planning
time at thousands of ranks)."""
from __future__ import annotations

from collections import deque
from itertools import repeat
from typing import NamedTuple

import numpy as np

from ..core.order import SampleRef

_COLUMNS = ("source", "epoch", "file", "row_group", "row", "tokens", "patches")


class Pick(NamedTuple):
    """A sample as planning sees it."""
    ref: SampleRef
    tokens: int       # sequence length after the sample transform (image placeholders included)
    patches: int = 0  # image patches: the vision encoder's work
    image_sizes: tuple[int, ...] = ()  # patches of each image

    def to_list(self) -> list:
        r = self.ref
        return [r.epoch, r.file, r.row_group, r.row, self.tokens, self.patches, list(self.image_sizes)]

    @classmethod
    def from_list(cls, source: str, item: list) -> "Pick":
        epoch, file, row_group, row, tokens, patches, sizes = item
        return cls(SampleRef(source, int(epoch), str(file), int(row_group), int(row)), int(tokens), int(patches),
                   tuple(int(s) for s in sizes))


class PickTable:
    """Samples as columns: ``source`` (index into ``sources``), ``epoch``, ``file`` (index into
    ``files``), ``row_group``, ``row``, ``tokens``, ``patches`` (int64) and ``image_sizes`` (an object
    array of tuples, or None when no sample has images). Row i is the i-th sample."""

    def __init__(self, sources: list[str], files: list[str], columns: dict[str, np.ndarray],
                 image_sizes: np.ndarray | None = None):
        self.sources = sources
        self.files = files
        self.columns = columns
        self.image_sizes = image_sizes
        self._keys: list[str] | None = None

    def __len__(self) -> int:
        return self.columns["row"].size

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["columns"][name]
        except KeyError:
            raise AttributeError(name) from None

    @classmethod
    def empty(cls, sources: list[str]) -> "PickTable":
        return cls(sources, [], {name: np.zeros(0, dtype=np.int64) for name in _COLUMNS})

    @classmethod
    def from_picks(cls, sources: list[str], picks: list[Pick]) -> "PickTable":
        index = {name: i for i, name in enumerate(sources)}
        columns = {"source": [index[p.ref.source] for p in picks], "epoch": [p.ref.epoch for p in picks],
                   "row_group": [p.ref.row_group for p in picks], "row": [p.ref.row for p in picks],
                   "tokens": [p.tokens for p in picks], "patches": [p.patches for p in picks]}
        files = list(dict.fromkeys(p.ref.file for p in picks))
        code = {f: i for i, f in enumerate(files)}
        columns["file"] = [code[p.ref.file] for p in picks]
        columns = {k: np.array(v, dtype=np.int64) for k, v in columns.items()}
        sizes = None
        if any(p.image_sizes for p in picks):
            sizes = np.empty(len(picks), dtype=object)
            sizes[:] = [tuple(p.image_sizes) for p in picks]
        return cls(sources, files, columns, sizes)

    def take(self, index: np.ndarray) -> "PickTable":
        return PickTable(self.sources, self.files, {k: v[index] for k, v in self.columns.items()},
                         self.image_sizes[index] if self.image_sizes is not None else None)

    def with_tokens(self, tokens: np.ndarray) -> "PickTable":
        return PickTable(self.sources, self.files, {**self.columns, "tokens": tokens}, self.image_sizes)

    def images(self) -> np.ndarray:
        """Images per sample."""
        if self.image_sizes is None:
            return np.zeros(len(self), dtype=np.int64)
        return np.fromiter(map(len, self.image_sizes), dtype=np.int64, count=len(self))

    def keys(self) -> list[str]:
        """Every sample's key (``sample_key``), made once."""
        if self._keys is None:
            c = self.columns
            names = np.array(self.sources, dtype=object)[c["source"]].tolist()
            files = np.array(self.files + [""], dtype=object)[c["file"]].tolist()
            self._keys = [f"{s}:{f}:{g}:{r}" for s, f, g, r in zip(names, files, c["row_group"].tolist(),
                                                                   c["row"].tolist())]
        return self._keys

    def picks(self, index: np.ndarray | None = None) -> list[Pick]:
        """Rows ``index`` (all by default) as ``Pick`` objects."""
        c = self.columns
        idx = slice(None) if index is None else index
        n = len(self) if index is None else len(index)
        names = np.array(self.sources, dtype=object)[c["source"][idx]].tolist()
        files = np.array(self.files + [""], dtype=object)[c["file"][idx]].tolist()
        # SampleRef(...) field by field through a frozen dataclass's __init__ costs ~1 us each;
        # the same objects are made here with their attribute dicts set in one C call each.
        refs = list(map(SampleRef.__new__, repeat(SampleRef, n)))
        deque(map(object.__setattr__, refs, repeat("__dict__"), [
            {"source": s, "epoch": e, "file": f, "row_group": g, "row": r} for s, e, f, g, r in zip(
                names, c["epoch"][idx].tolist(), files, c["row_group"][idx].tolist(),
                c["row"][idx].tolist())]), maxlen=0)
        sizes = self.image_sizes[idx].tolist() if self.image_sizes is not None else repeat(())
        return list(map(tuple.__new__, repeat(Pick), zip(refs, c["tokens"][idx].tolist(),
                                                         c["patches"][idx].tolist(), sizes)))
