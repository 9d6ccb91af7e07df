"""The catalogs loaders register with, as the Planner finds them: by digest in the catalog cache
(``source_catalog``; the same machine's, or a shared folder), else from the source's files, which
must then give the same digest."""
from __future__ import annotations

import threading

from .. import allocator
from ..config import Config
from ..core.order import RowGroups
from ..source_catalog import cached_row_groups, load_catalog


class CatalogCache:
    """``(source, digest) -> row groups`` (columns: ``RowGroups``), read once per source and digest."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self._row_groups: dict[tuple[str, str], RowGroups] = {}
        self._lock = threading.Lock()  # registrations arrive on several server threads

    def __call__(self, source: str, digest: str) -> RowGroups:
        with self._lock:
            if (source, digest) not in self._row_groups:
                self._row_groups[(source, digest)] = self._read(source, digest)
                allocator.trim()  # reading a corpus-sized catalog's columns left its transients' pages in the heap
            return self._row_groups[(source, digest)]

    def _read(self, source: str, digest: str) -> RowGroups:
        row_groups = cached_row_groups(digest)
        if row_groups is not None:
            return row_groups
        catalog = load_catalog(self.cfg.source(source))  # another host's cache: the files say
        if catalog.digest() != digest:
            raise ValueError(f"register: a loader of source {source!r} has catalog {digest}, the source's files "
                             f"give {catalog.digest()} here: its files differ between hosts")
        return catalog.row_groups()
