"""One source as the Planner sees it: its global sample order plus each sample's metadata.

Metadata comes from the owning loader (fetched through a callback, once per row group and
epoch), so this class is pure given that callback and easy to test.
"""
from __future__ import annotations

import collections
from typing import Callable, Iterator, NamedTuple

import numpy as np

from ..core.order import RowGroupRef, SampleRef, epoch_row_groups, row_permutation


class Pick(NamedTuple):
    """A sample as planning sees it."""
    ref: SampleRef
    tokens: int       # sequence length after the sample transform (image placeholders included)
    patches: int = 0  # image patches: the vision encoder's work
    image_sizes: tuple[int, ...] = ()  # patches of each image


# (epoch, row group) -> {"num_tokens": per row, optional "image_patches": per row, "image_sizes": list per row}
FetchMeta = Callable[[int, RowGroupRef], dict[str, np.ndarray]]


class SourceFeed:
    def __init__(self, name: str, row_groups: list[RowGroupRef], seed: int, fetch_meta: FetchMeta):
        self.name = name
        self.skipped = 0  # unreadable or empty samples passed over
        self.drawn = 0    # samples handed out by next() (a deferred one counts each time)
        self._samples = self._walk(sorted(row_groups), seed, fetch_meta)
        self._deferred: collections.deque[Pick] = collections.deque()

    def _walk(self, row_groups, seed, fetch_meta) -> Iterator[Pick]:
        for epoch, rg in epoch_row_groups(row_groups, seed=seed, source=self.name):
            meta = fetch_meta(epoch, rg)
            tokens = meta["num_tokens"]
            patches = meta.get("image_patches", np.zeros(len(tokens), dtype=np.int64))
            sizes = meta.get("image_sizes")
            for row in row_permutation(rg, seed=seed, source=self.name, epoch=epoch):
                if tokens[row] <= 0:
                    self.skipped += 1
                    continue
                yield Pick(SampleRef(self.name, epoch, rg.file, rg.row_group, int(row)), int(tokens[row]),
                           int(patches[row]), tuple(sizes[row]) if sizes is not None else ())

    def next(self) -> Pick:
        """The next sample to plan: deferred ones first, in their order, then the stream."""
        self.drawn += 1
        if self._deferred:
            return self._deferred.popleft()
        return next(self._samples)

    def summary(self) -> dict:
        """What is waiting: the deferred samples (first in line next step) and what was drawn so far."""
        return {"deferred": len(self._deferred), "deferred_tokens": sum(p.tokens for p in self._deferred),
                "drawn": self.drawn}

    def defer(self, items: list[Pick]) -> None:
        """Give planned-but-unplaced samples back; they come first next time, in the same order."""
        self._deferred.extendleft(reversed(items))
