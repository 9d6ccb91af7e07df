"""The catalogs loaders register with, as the Planner finds them by digest: in its catalog cache
(``source_catalog``; this host's, or a shared folder), else from a loader of the source that registered
(``CatalogFetch``: the Planner's host need not see the data), which it then caches, else from the source's
files, which must then give the same digest. Files last: at 100,000 files a ``stat`` per file is the
slow path, and a Planner on a host without the data has none to read."""
from __future__ import annotations

import logging
import threading
from typing import Callable, Sequence

import pyarrow as pa

from .. import allocator
from ..config import Config, ConfigError
from ..core.order import RowGroups
from ..source_catalog import (
    SourceCatalog,
    cached_row_groups,
    catalog_dir,
    keep_received,
    load_catalog,
    received_catalog,
)

log = logging.getLogger(__name__)
CatalogFetch = Callable[[str, str, str], pa.Table]  # (loader location, source, digest) -> the catalog's table
FETCH_ERRORS = (pa.ArrowException, ValueError, KeyError, OSError)  # a loader that cannot send it, or sent another


class CatalogCache:
    """``(source, digest) -> row groups`` (columns: ``RowGroups``), found once per source and digest."""

    def __init__(self, cfg: Config, fetch: CatalogFetch | None = None):
        """``fetch``: a catalog from a loader (``calls.CatalogCalls``); None: the cache, else the files."""
        self.cfg = cfg
        self.fetch = fetch
        self._row_groups: dict[tuple[str, str], RowGroups] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}  # one per catalog: a slow loader delays its own
        self._lock = threading.Lock()  # registrations arrive on several server threads

    def __call__(self, source: str, digest: str, locations: Sequence[str] = ()) -> RowGroups:
        """``locations``: loaders of the source that registered with it, the one registering now first."""
        key = (source, digest)
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._row_groups:
                self._row_groups[key] = self._read(source, digest, locations)
                allocator.trim()  # reading a corpus-sized catalog's columns left its transients' pages in the heap
            return self._row_groups[key]

    def _read(self, source: str, digest: str, locations: Sequence[str]) -> RowGroups:
        row_groups = cached_row_groups(digest)
        if row_groups is not None:
            return row_groups
        catalog, why = self._fetched(source, digest, locations)
        if catalog is not None:
            keep_received(catalog)
            return catalog.row_groups()
        try:
            catalog = load_catalog(self.cfg.source(source))
        except ConfigError as exc:
            raise ValueError(f"register: catalog {digest} of source {source!r} is not in this Planner's catalog "
                             f"cache ({catalog_dir()}), {why}, and the source's files cannot be read here "
                             f"({exc})") from None
        if catalog.digest() != digest:
            raise ValueError(f"register: a loader of source {source!r} has catalog {digest}, the source's files "
                             f"give {catalog.digest()} here: its files differ between hosts")
        return catalog.row_groups()

    def _fetched(self, source: str, digest: str, locations: Sequence[str]) -> tuple[SourceCatalog | None, str]:
        """The catalog from the first of ``locations`` that sends it, checked; else (None, why not)."""
        if self.fetch is None or not locations:
            return None, "no loader was asked for it"
        failures = []
        for location in locations:
            try:
                return received_catalog(self.fetch(location, source, digest), digest), ""
            except FETCH_ERRORS as exc:
                failures.append(f"{location}: {_one_line(exc)}")
                log.warning("source %s: catalog %s not received from the loader at %s (%s)", source, digest,
                            location, _one_line(exc))
        return None, f"its loaders did not send it ({'; '.join(failures)})"


def _one_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
