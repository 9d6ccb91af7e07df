"""One source as the Planner sees it: its global sample order plus each sample's metadata.

The position in the order is an explicit cursor of plain numbers (epoch, index of the row group
in that epoch's seeded order, index of the row in the row group's seeded permutation), so the
feed can be saved and restored exactly. Metadata comes from the owning loader through a callback,
once per row group and epoch, so this class is pure given that callback and easy to test.
"""
from __future__ import annotations

import collections
from typing import Callable, NamedTuple

import numpy as np
import pyarrow.compute as pc

from ..core.order import ReadOrder, RowGroupRef, SampleRef, Window
from .picks import Pick, PickTable

__all__ = ["FeedStream", "Pick", "SourceFeed"]


# (epoch, row group) -> {"num_tokens": per row, optional "image_patches": per row, "image_sizes": list per row}
FetchMeta = Callable[[int, RowGroupRef], dict[str, np.ndarray]]


def row_group_metadata(table, num_rows: int) -> dict:
    """A loader's metadata table of one row group (``sample_metadata`` rows, by their ``row``) as the
    feeds read it: per row its tokens, patches and image sizes (rows absent count zero). The same for
    metadata fetched from a loader and read from the files offline, so a re-derived plan matches."""
    rows = table.column("row").to_numpy()
    meta = {}
    for name in ("num_tokens", "image_patches"):
        meta[name] = np.zeros(num_rows, dtype=np.int64)
        meta[name][rows] = table.column(name).to_numpy()
    meta["image_sizes"] = [()] * num_rows
    images = table.column("image_sizes")
    if pc.sum(pc.list_value_length(images)).as_py():  # a text row group has none: no list per row
        for row, sizes in zip(rows.tolist(), images.to_pylist()):
            meta["image_sizes"][row] = tuple(sizes)
    return meta


class SourceFeed:
    def __init__(self, name: str, row_groups: list[RowGroupRef], seed: int, fetch_meta: FetchMeta,
                 window: int = 1):
        """``window``: row groups whose rows are drawn interleaved (core/order.py); the cursor's
        ``rg_index`` then counts windows."""
        self._start(ReadOrder(name, row_groups, seed, window), fetch_meta)

    @classmethod
    def over(cls, order: ReadOrder, fetch_meta: FetchMeta) -> "SourceFeed":
        """A feed at the start of ``order`` (shared with other feeds of the source: its epochs' orders
        are computed once for them all)."""
        feed = cls.__new__(cls)
        feed._start(order, fetch_meta)
        return feed

    def _start(self, order: ReadOrder, fetch_meta: FetchMeta) -> None:
        if not order.rows:
            raise ValueError(f"source {order.name!r} has no rows")
        self.order = order
        self.name, self.seed, self.window, self.row_groups = order.name, order.seed, order.window, order.row_groups
        self.fetch_meta = fetch_meta
        self.epoch, self.rg_index, self.row_index = 0, 0, 0  # the cursor: the next sample of the stream
        self.skipped = 0  # unreadable or empty samples passed over
        self.drawn = 0    # samples handed out by next() (a deferred one counts each time)
        self._deferred: collections.deque[Pick] = collections.deque()
        self._current: list | None = None  # [(epoch, index), unit, permutation, metadata, its lists or None]

    def next(self) -> Pick:
        """The next sample to plan: deferred ones first, in their order, then the stream."""
        self.drawn += 1
        if self._deferred:
            return self._deferred.popleft()
        passed = 0  # rows passed over since the last sample: a whole epoch of them means nothing is readable
        while True:
            rg, permutation, meta, lengths = self._row_group()
            if self.row_index >= len(permutation):
                self._advance()
                continue
            row = permutation[self.row_index]
            self.row_index += 1
            tokens = int(lengths[row])
            if tokens <= 0:
                passed = self._pass_empty(passed)
                continue
            patches = meta.get("image_patches")
            sizes = meta.get("image_sizes")
            file, group, local = _where(rg, row)
            return Pick(SampleRef(self.name, self.epoch, file, group, local), tokens,
                        int(patches[row]) if patches is not None else 0,
                        tuple(sizes[row]) if sizes is not None else ())

    def _pass_empty(self, passed: int) -> int:
        """An empty (or unreadable) row passed over, after ``passed`` others since the last sample:
        a whole epoch of them means nothing is readable."""
        self.skipped += 1
        if passed + 1 > self.order.rows:
            raise ValueError(f"source {self.name!r}: no readable sample in a whole epoch (every row group "
                             f"failed to read, or every sample is empty): see its loaders' logs")
        return passed + 1

    def stream(self) -> "FeedStream":
        """The samples ``next()`` would return, as token counts at Python speed (the mixer's loop);
        ``FeedStream.picks()`` then gives those samples, made in bulk."""
        return FeedStream(self)

    def _advance(self) -> None:
        self.row_index = 0
        self.rg_index += 1
        if self.rg_index == self.order.units:
            self.epoch, self.rg_index = self.epoch + 1, 0

    def _unit(self) -> tuple[RowGroupRef | Window, np.ndarray, dict]:
        """The row group (or window) under the cursor, its row permutation and its metadata (fetched once)."""
        where = (self.epoch, self.rg_index)
        if self._current is None or self._current[0] != where:
            unit, permutation = self.order.unit(self.epoch, self.rg_index)
            if isinstance(unit, Window):  # every row group of the window at once: its rows interleave
                meta = _joined([(part, self.fetch_meta(self.epoch, part)) for part in unit.row_groups])
            else:
                meta = self.fetch_meta(self.epoch, unit)
            self._current = [where, unit, permutation, meta, None]
        return self._current[1], self._current[2], self._current[3]

    def _row_group(self) -> tuple[RowGroupRef | Window, list[int], dict, list]:
        """``_unit()`` with the permutation and the lengths as Python lists, read once per sample by
        ``next()`` (numpy scalars cost more); made once per row group, when first asked for."""
        unit, permutation, meta = self._unit()
        if self._current[4] is None:
            self._current[4] = (permutation.tolist(), np.asarray(meta["num_tokens"]).tolist())
        permutation_list, lengths = self._current[4]
        return unit, permutation_list, meta, lengths

    def _permutation(self) -> np.ndarray:
        """The row permutation of the row group (or window) under the cursor, as an array."""
        return self._unit()[1]

    def frontier(self) -> int:
        """The first position of the read order (epoch * row groups + index in the epoch's order) whose
        metadata this feed never asked for: everything before it was (the row group under the cursor
        is asked for as soon as its first row is drawn)."""
        started = self.rg_index + (1 if self.row_index > 0 else 0)  # row groups, or windows of them
        return self.epoch * len(self.row_groups) + min(len(self.row_groups), started * self.window)

    def summary(self) -> dict:
        """What is waiting: the deferred samples (first in line next step) and what was drawn so far."""
        return {"deferred": len(self._deferred), "deferred_tokens": sum(p.tokens for p in self._deferred),
                "drawn": self.drawn}

    def defer(self, items: list[Pick]) -> None:
        """Give planned-but-unplaced samples back; they come first next time, in the same order."""
        self._deferred.extendleft(reversed(items))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "row_group": self.rg_index, "row": self.row_index, "skipped": self.skipped,
                "drawn": self.drawn, "deferred": [p.to_list() for p in self._deferred]}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.rg_index, self.row_index = int(state["epoch"]), int(state["row_group"]), int(state["row"])
        self.skipped, self.drawn = int(state["skipped"]), int(state["drawn"])
        self._deferred = collections.deque(Pick.from_list(self.name, item) for item in state["deferred"])
        self._current = None


class FeedStream:
    """One step's draw from a feed: ``next_tokens()`` moves the feed's cursor exactly as ``next()``
    does (deferred samples first, empty rows skipped, the same error on an unreadable epoch) but
    returns only the sample's token count; the drawn samples are the row-group slices passed over,
    turned into ``Pick`` objects at once by ``picks()`` (per-sample objects were most of the draw)."""

    def __init__(self, feed: SourceFeed):
        self._feed = feed
        self._parts: list[list] = []  # Picks, or [epoch, row group, permutation, meta, start, end]
        self.next_tokens = self._tokens().__next__

    def take(self, n: int) -> None:
        """Draw ``n`` samples at once (when their token counts are not needed one by one): what ``n``
        calls of ``next()`` draw, the runs of readable rows of a row group as one slice each."""
        feed = self._feed
        while n > 0 and feed._deferred:
            self._parts.append([feed._deferred.popleft()])
            feed.drawn += 1
            n -= 1
        while n > 0:
            rg, permutation, meta = feed._unit()
            start = feed.row_index
            rows = permutation[start:start + n]
            empty = np.flatnonzero(np.asarray(meta["num_tokens"])[rows] <= 0)
            run = int(empty[0]) if empty.size else rows.size  # readable rows in a row from the cursor
            if run:
                self._parts.append([feed.epoch, rg, permutation, meta, start, start + run])
                feed.row_index += run
                feed.drawn += run
                n -= run
            elif rows.size:  # an empty row next: next() skips it (and knows when nothing is readable)
                self._parts.append([feed.next()])
                n -= 1
            else:
                feed._advance()

    def _tokens(self):
        feed = self._feed
        while feed._deferred:
            pick = feed._deferred.popleft()
            self._parts.append([pick])
            feed.drawn += 1
            yield pick.tokens
        passed = 0
        while True:
            rg, permutation, meta, lengths = feed._row_group()
            start = feed.row_index
            segment = [feed.epoch, rg, feed._permutation(), meta, start, start]
            self._parts.append(segment)
            for position in range(start, len(permutation)):
                tokens = lengths[permutation[position]]
                feed.row_index = position + 1
                if tokens <= 0:
                    passed = feed._pass_empty(passed)
                    continue
                passed = 0
                feed.drawn += 1
                segment[5] = position + 1
                yield int(tokens)
            feed._advance()

    def table(self, source: int, sources: list[str]) -> PickTable:
        """Every sample drawn so far, in order, as ``next()`` would have returned them: as columns,
        the source given as ``source`` (its index in ``sources``)."""
        return drawn_table([(source, self)], sources)

    def pieces(self, source: int) -> list[_Piece]:
        """The drawn samples, a run of rows (or one deferred sample) per piece."""
        out = []
        for part in self._parts:
            if len(part) == 1:
                pick = part[0]
                r = pick.ref
                out.append(_Piece(source, r.epoch, [r.file], None, [r.row_group], np.array([r.row]),
                                  np.array([pick.tokens]), np.array([pick.patches]),
                                  [tuple(pick.image_sizes)] if pick.image_sizes else None))
                continue
            epoch, rg, permutation, meta, start, end = part
            lengths = np.asarray(meta["num_tokens"])
            rows = permutation[start:end]
            rows = rows[lengths[rows] > 0]
            patches, sizes = meta.get("image_patches"), meta.get("image_sizes")
            sizes = [tuple(sizes[r]) for r in rows.tolist()] if sizes is not None else None
            patches = np.asarray(patches)[rows] if patches is not None else None
            if isinstance(rg, Window):  # rows of the window's row groups, interleaved: each row's own file
                which, local = rg.locate(rows)
                out.append(_Piece(source, epoch, [g.file for g in rg.row_groups], np.asarray(which, dtype=np.int64),
                                  [g.row_group for g in rg.row_groups], local, lengths[rows], patches, sizes))
            else:
                out.append(_Piece(source, epoch, [rg.file], None, [rg.row_group], rows, lengths[rows], patches, sizes))
        return out

    def picks(self) -> list[Pick]:
        """``table()`` as ``Pick`` objects."""
        return self.table(0, [self._feed.name]).picks()


class _Piece(NamedTuple):
    """Drawn samples of one row group (or window, or one deferred sample) as ``PickTable`` columns."""
    source: int
    epoch: int
    files: list[str]
    which: np.ndarray | None  # per row, its file among ``files`` (a window); None: the one file
    row_groups: list[int]     # per file
    rows: np.ndarray
    tokens: np.ndarray
    patches: np.ndarray | None
    image_sizes: list | None


def drawn_table(streams: list[tuple[int, FeedStream]], sources: list[str]) -> PickTable:
    """The samples each of ``streams`` drew, stream after stream, as one ``PickTable`` (each stream's
    source given by its index in ``sources``): ``PickTable.concat`` of every ``FeedStream.table``, made
    in one pass over their pieces rather than a table per piece."""
    pieces = [piece for source, stream in streams for piece in stream.pieces(source)]
    if not pieces:
        return PickTable.empty(sources)
    counts = [len(p.rows) for p in pieces]
    first_file = np.cumsum([0] + [len(p.files) for p in pieces[:-1]]).tolist()  # each piece's file codes, moved up
    columns = {"source": np.repeat(np.array([p.source for p in pieces], dtype=np.int64), counts),
               "epoch": np.repeat(np.array([p.epoch for p in pieces], dtype=np.int64), counts),
               "file": np.repeat(np.array(first_file, dtype=np.int64), counts),
               "row_group": np.repeat(np.array([p.row_groups[0] for p in pieces], dtype=np.int64), counts),
               "row": np.concatenate([p.rows for p in pieces]).astype(np.int64, copy=False),
               "tokens": np.concatenate([p.tokens for p in pieces]).astype(np.int64, copy=False),
               "patches": np.concatenate([p.patches if p.patches is not None else np.zeros(len(p.rows), np.int64)
                                          for p in pieces]).astype(np.int64, copy=False)}
    ends = np.cumsum(counts).tolist()
    for p, end, n in zip(pieces, ends, counts):
        if p.which is not None:  # a window: each row's own file and row group
            columns["file"][end - n:end] += p.which
            columns["row_group"][end - n:end] = np.asarray(p.row_groups, dtype=np.int64)[p.which]
    sizes = None
    if any(p.image_sizes is not None for p in pieces):
        sizes = np.empty(len(columns["row"]), dtype=object)
        sizes[:] = [s for p in pieces for s in (p.image_sizes if p.image_sizes is not None else [()] * len(p.rows))]
    return PickTable(sources, [f for p in pieces for f in p.files], columns, sizes)


def _where(unit: RowGroupRef | Window, row: int) -> tuple[str, int, int]:
    """(file, row group, row) of a row of the unit under the cursor (a row group, or a window)."""
    if isinstance(unit, Window):
        which, local = unit.locate([row])
        rg = unit.row_groups[int(which[0])]
        return rg.file, rg.row_group, int(local[0])
    return unit.file, unit.row_group, row


def _joined(parts: list[tuple[RowGroupRef, dict]]) -> dict:
    """The metadata of a window's row groups, as one row group's (its virtual rows in order)."""
    first = parts[0][1]
    joined = {key: np.concatenate([np.asarray(meta[key])[:rg.num_rows] for rg, meta in parts])
              for key in ("num_tokens", "image_patches") if key in first}
    if "image_sizes" in first:
        joined["image_sizes"] = [sizes for rg, meta in parts for sizes in list(meta["image_sizes"])[:rg.num_rows]]
    return joined
