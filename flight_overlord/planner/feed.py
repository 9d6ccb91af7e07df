"""One source as the Planner sees it: its global sample order plus each sample's size.

Sizes come from the owning loader's metadata (fetched through a callback, once per row
group and epoch), so this class is pure given that callback and easy to test.
"""
from __future__ import annotations

import collections
from typing import Callable, Iterator

import numpy as np

from ..core.order import RowGroupRef, SampleRef, epoch_row_groups, row_permutation

FetchSizes = Callable[[int, RowGroupRef], np.ndarray]  # (epoch, row group) -> num_tokens per row


class SourceFeed:
    def __init__(self, name: str, row_groups: list[RowGroupRef], seed: int, fetch_sizes: FetchSizes):
        self.name = name
        self.skipped = 0  # unreadable or empty samples passed over
        self._samples = self._walk(sorted(row_groups), seed, fetch_sizes)
        self._deferred: collections.deque[tuple[SampleRef, int]] = collections.deque()

    def _walk(self, row_groups, seed, fetch_sizes) -> Iterator[tuple[SampleRef, int]]:
        for epoch, rg in epoch_row_groups(row_groups, seed=seed, source=self.name):
            sizes = fetch_sizes(epoch, rg)
            for row in row_permutation(rg, seed=seed, source=self.name, epoch=epoch):
                if sizes[row] <= 0:
                    self.skipped += 1
                    continue
                yield SampleRef(self.name, epoch, rg.file, rg.row_group, int(row)), int(sizes[row])

    def next(self) -> tuple[SampleRef, int]:
        """The next sample to plan: deferred ones first, in their order, then the stream."""
        if self._deferred:
            return self._deferred.popleft()
        return next(self._samples)

    def defer(self, items: list[tuple[SampleRef, int]]) -> None:
        """Give planned-but-unplaced samples back; they come first next time, in the same order."""
        self._deferred.extendleft(reversed(items))
