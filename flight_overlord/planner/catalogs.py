"""The catalogs loaders register with, as the Planner finds them: by digest in the catalog cache
(``source_catalog``; the same machine's, or a shared folder), else from the source's files, which
must then give the same digest."""
from __future__ import annotations

import threading

from ..config import Config
from ..core.order import RowGroupRef
from ..source_catalog import cached_catalog, load_catalog


class CatalogCache:
    """``(source, digest) -> row groups`` (sorted), read once per source and digest."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self._row_groups: dict[tuple[str, str], list[RowGroupRef]] = {}
        self._lock = threading.Lock()  # registrations arrive on several server threads

    def __call__(self, source: str, digest: str) -> list[RowGroupRef]:
        with self._lock:
            if (source, digest) not in self._row_groups:
                self._row_groups[(source, digest)] = self._read(source, digest)
            return self._row_groups[(source, digest)]

    def _read(self, source: str, digest: str) -> list[RowGroupRef]:
        spec = self.cfg.source(source)
        catalog = cached_catalog(digest)
        if catalog is None:  # another host's cache: the files say
            catalog = load_catalog(spec)
            if catalog.digest() != digest:
                raise ValueError(f"register: a loader of source {source!r} has catalog {digest}, the source's files "
                                 f"give {catalog.digest()} here: its files differ between hosts")
        return catalog.row_groups()
