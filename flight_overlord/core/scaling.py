"""Mixture-driven scaling of a source's loader actors (the paper's section 5.2), without I/O.

Two pure pieces, both plain numbers to save and restore:

- ``Scaler`` decides when. Each step's mixture weights are averaged per source over intervals of
  ``interval`` steps; a source's *load* is that average weight per active actor. A load above
  ``up_threshold`` for ``consecutive`` intervals in a row adds one actor (up to ``max_actors``), a
  load below ``down_threshold`` for as many removes one (down to the configured ``loaders``).
  ``down_threshold <= up_threshold / 2`` (checked by the config) means a decision never undoes
  itself at the next interval: one more actor at most halves the load.
- ``Ownership`` says who owns what. Slot ``g`` of a source's global read order is row group
  ``g % R`` of epoch ``g // R``'s seeded order (R row groups). Ownership is a list of segments
  ``[first slot, actors]``: from ``first`` on, the row group of catalog index ``i`` belongs to
  actor ``i % actors``. A reshard appends a segment whose first slot lies past everything any
  current owner may have read ahead (``boundary``), so nothing buffered changes hands: no row group
  is read by two actors, none is skipped, and the read order, a function of the seed alone, is the
  same for any number of actors. ``ActorSlots`` numbers the slots one actor owns 0, 1, 2, ...
  (its local slots, what its journal counts); with one segment this is the actor's static order.
"""
from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..stateful import Stateful
from .order import RowGroupRef, RowGroups


@dataclass(frozen=True)
class ScaleEvent:
    step: int         # the step boundary: plans from this step on see the new ownership
    source: str
    actors: int       # active actors from the boundary on
    previous: int
    load: float       # the interval's mean weight per actor that triggered it
    boundary: int = -1  # first slot of the source's read order owned the new way

    def to_dict(self) -> dict:
        return {"step": self.step, "source": self.source, "actors": self.actors, "previous": self.previous,
                "load": round(self.load, 6), "boundary": self.boundary}


class Scaler(Stateful):
    def __init__(self, minimum: dict[str, int], *, interval: int, up_threshold: float, down_threshold: float,
                 consecutive: int, max_actors: int | dict[str, int]):
        """``minimum``: each source's configured actors; ``max_actors``: at most, for every source or per
        source (a source at its minimum there never scales)."""
        if interval < 1 or consecutive < 1:
            raise ValueError("scaling: interval and consecutive must be >= 1")
        if not 0 <= down_threshold <= up_threshold / 2:
            raise ValueError(f"scaling: need 0 <= down_threshold <= up_threshold / 2 (got {down_threshold}, "
                             f"{up_threshold}), or one scale-up could trigger a scale-down")
        self.minimum = dict(minimum)
        self.interval, self.up, self.down = interval, up_threshold, down_threshold
        self.consecutive = consecutive
        self.maximum = {s: max(n, max_actors[s] if isinstance(max_actors, dict) else max_actors)
                        for s, n in minimum.items()}
        self.actors = dict(minimum)
        self._sums = {s: 0.0 for s in minimum}
        self._steps = 0  # steps folded into the current interval
        self._above = {s: 0 for s in minimum}  # consecutive intervals over up_threshold
        self._below = {s: 0 for s in minimum}

    def observe(self, step: int, weights: dict[str, float]) -> list[ScaleEvent]:
        """Fold in step ``step``'s weights (any scale; normalized here); at the end of an interval,
        the scaling decisions that take effect at this step, in source order."""
        total = sum(weights.values())
        for source in self._sums:
            self._sums[source] += weights.get(source, 0.0) / total if total > 0 else 0.0
        self._steps += 1
        if self._steps < self.interval:
            return []
        events = []
        for source in self._sums:
            load = self._sums[source] / self._steps / self.actors[source]
            self._above[source] = self._above[source] + 1 if load > self.up else 0
            self._below[source] = self._below[source] + 1 if load < self.down else 0
            n = self.actors[source]
            if self._above[source] >= self.consecutive and n < self.maximum[source]:
                self.actors[source] = n + 1
            elif self._below[source] >= self.consecutive and n > self.minimum[source]:
                self.actors[source] = n - 1
            if self.actors[source] != n:
                self._above[source] = self._below[source] = 0
                events.append(ScaleEvent(step, source, self.actors[source], n, load))
            self._sums[source] = 0.0
        self._steps = 0
        return events

    def state_dict(self) -> dict:
        return {"actors": dict(self.actors), "sums": dict(self._sums), "steps": self._steps,
                "above": dict(self._above), "below": dict(self._below)}

    def load_state_dict(self, state: dict) -> None:
        self.actors = {s: int(state["actors"].get(s, n)) for s, n in self.minimum.items()}
        self._sums = {s: float(state["sums"].get(s, 0.0)) for s in self.minimum}
        self._steps = int(state["steps"])
        self._above = {s: int(state["above"].get(s, 0)) for s in self.minimum}
        self._below = {s: int(state["below"].get(s, 0)) for s in self.minimum}


class Ownership:
    """Which actor of a source owns each slot of its read order (see the module doc)."""

    def __init__(self, catalog: Iterable[RowGroupRef], *, seed: int, source: str, segments: list):
        self.catalog = RowGroups.of(catalog)  # sorted, as columns: a loader host holds one per actor
        if not len(self.catalog):
            raise ValueError(f"source {source!r}: ownership of an empty catalog")
        self.seed, self.source = seed, source
        self.segments: list[tuple[int, int]] = []
        for first, actors in segments:
            self.extend(int(first), int(actors))
        self._orders: dict[int, np.ndarray] = {}  # epoch -> catalog indices (int32) in that epoch's order
        self._inverse: dict[int, np.ndarray] = {}  # epoch -> index in the order of each catalog index

    @property
    def rows(self) -> int:
        return len(self.catalog)

    def extend(self, first: int, actors: int) -> None:
        if actors < 1 or (self.segments and first <= self.segments[-1][0]) or (not self.segments and first != 0):
            raise ValueError(f"source {self.source!r}: segment [{first}, {actors}] does not extend {self.segments}")
        self.segments.append((first, actors))

    def _order(self, epoch: int) -> np.ndarray:
        """The catalog indices in ``epoch``'s seeded order: ``core.order.epoch_order``'s order (the same
        key), as indices, so owning a slot needs no lookup by name."""
        order = self._orders.get(epoch)
        if order is None:  # (several threads may ask: the result is returned, never re-read)
            order = self._orders[epoch] = self.catalog.epoch_order(self.seed, self.source, epoch)
            _trim(self._orders, keep=2)
        return order

    def slot(self, epoch: int, file: str, row_group: int) -> int:
        try:
            index = self.catalog.index(file, row_group)
        except KeyError:
            raise KeyError(f"row group {file}:{row_group} is not in source {self.source!r}") from None
        inverse = self._inverse.get(epoch)
        if inverse is None:
            inverse = np.empty(self.rows, dtype=np.int32)
            inverse[self._order(epoch)] = np.arange(self.rows, dtype=np.int32)
            self._inverse[epoch] = inverse
            _trim(self._inverse, keep=2)
        return epoch * self.rows + int(inverse[index])

    def row_group(self, slot: int) -> RowGroupRef:
        epoch, index = divmod(slot, self.rows)
        return self.catalog[int(self._order(epoch)[index])]

    def actors_at(self, slot: int) -> int:
        if slot >= self.segments[-1][0]:
            return self.segments[-1][1]
        return self.segments[bisect.bisect_right([f for f, _ in self.segments], slot) - 1][1]

    def owner_at(self, slot: int) -> int:
        epoch, index = divmod(slot, self.rows)
        return int(self._order(epoch)[index]) % self.actors_at(slot)

    def owners_of_epoch(self, epoch: int) -> np.ndarray:
        """The owner of every slot of ``epoch``, at once."""
        base = epoch * self.rows
        firsts = np.array([f for f, _ in self.segments], dtype=np.int64)
        actors = np.array([a for _, a in self.segments], dtype=np.int64)
        counts = actors[np.searchsorted(firsts, base + np.arange(self.rows), side="right") - 1]
        return self._order(epoch) % counts

    def owner(self, epoch: int, file: str, row_group: int) -> int:
        return self.owner_at(self.slot(epoch, file, row_group))

    def boundary(self, cursor: int, read_ahead: int) -> int:
        """The first slot a new segment may start at, when the Planner's feed has asked metadata
        for every slot below ``cursor`` and for none at or past it. An actor reads ahead at most
        ``read_ahead`` of its own slots past its last demand, so past the first ``read_ahead``
        slots every owner has at or after ``cursor`` (segments not reached yet included), nothing
        has been read: ownership may change there."""
        last_first = self.segments[-1][0]
        limit = max(cursor, last_first) + self.rows * read_ahead
        active = min(self.segments[-1][1], self.rows)
        counts: dict[int, int] = {}
        end = cursor
        slot = cursor
        while slot < limit:
            if slot >= last_first and all(counts.get(a, 0) >= read_ahead for a in range(active)):
                break
            owner = self.owner_at(slot)
            if counts.get(owner, 0) < read_ahead:
                counts[owner] = counts.get(owner, 0) + 1
                end = slot + 1
            slot += 1
        return max(end, last_first + 1)

    def actor_slots(self, actor: int) -> "ActorSlots":
        return ActorSlots(self, actor)

    def to_list(self) -> list[list[int]]:
        return [[f, a] for f, a in self.segments]


class ActorSlots:
    """The slots one actor owns, numbered 0, 1, 2, ... in read order (its local slots)."""

    def __init__(self, ownership: Ownership, actor: int):
        self.ownership, self.actor = ownership, actor
        self._owned: dict[int, np.ndarray] = {}  # epoch -> indices in that epoch's order owned by the actor
        self._prefix = [0]  # local slots before each epoch, epochs up to the last segment's
        self._lock = threading.RLock()  # an actor's reading and serving threads share its slots

    def _owned_in(self, epoch: int) -> np.ndarray:
        owned = self._owned.get(epoch)
        if owned is None:
            owned = self._owned[epoch] = np.flatnonzero(self.ownership.owners_of_epoch(epoch) == self.actor)
            _trim(self._owned, keep=2)
        return owned

    def _count_in(self, epoch: int) -> int:
        """Slots of ``epoch`` this actor owns: counted without the epoch's order when one segment
        covers the whole epoch (only an epoch a boundary falls in needs its order)."""
        o, first = self.ownership, epoch * self.ownership.rows
        actors = o.actors_at(first)
        if all(not first < f < first + o.rows for f, _ in o.segments):
            return len(range(self.actor, o.rows, actors)) if self.actor < actors else 0
        return len(self._owned_in(epoch))

    @property
    def _last_epoch(self) -> int:
        """Epochs after this one lie inside the last segment: the same count each."""
        return self.ownership.segments[-1][0] // self.ownership.rows

    def _before(self, epoch: int) -> int:
        last = self._last_epoch
        with self._lock:  # two threads extending the prefix at once would append one epoch twice
            while len(self._prefix) <= min(epoch, last + 1):
                e = len(self._prefix) - 1
                self._prefix.append(self._prefix[-1] + self._count_in(e))
        if epoch <= last + 1:
            return self._prefix[epoch]
        return self._prefix[last + 1] + (epoch - last - 1) * self._steady

    def owned_per_epoch(self) -> int:
        """Row groups of an epoch this actor owns under the last segment (0: idle or reclaimed)."""
        actors = self.ownership.segments[-1][1]
        return len(range(self.actor, self.ownership.rows, actors)) if self.actor < actors else 0

    @property
    def _steady(self) -> int:
        return self.owned_per_epoch()

    def local(self, slot: int) -> int | None:
        """The local slot of global ``slot``; None when this actor does not own it."""
        epoch, index = divmod(slot, self.ownership.rows)
        owned = self._owned_in(epoch)
        i = int(np.searchsorted(owned, index))
        if i == len(owned) or owned[i] != index:
            return None
        return self._before(epoch) + i

    def global_slot(self, local: int) -> int | None:
        """The global slot of local slot ``local``; None past the end (no longer owning)."""
        last = self._last_epoch
        if local >= self._before(last + 1):
            if not self._steady:
                return None
            epoch = last + 1 + (local - self._before(last + 1)) // self._steady
        else:
            epoch = bisect.bisect_right(self._prefix[:last + 2], local) - 1
            while self._prefix[epoch + 1] <= local:  # epochs that own nothing
                epoch += 1
        return epoch * self.ownership.rows + int(self._owned_in(epoch)[local - self._before(epoch)])

    def first_local_at(self, slot: int) -> int:
        """How many slots below global ``slot`` this actor owns."""
        epoch, index = divmod(slot, self.ownership.rows)
        return self._before(epoch) + int(np.searchsorted(self._owned_in(epoch), index))


def _trim(cache: dict, keep: int = 4) -> None:
    """Keep the newest ``keep`` epochs of a cache (a few at a time are ever in use)."""
    while len(cache) > keep:
        try:
            cache.pop(next(iter(cache)), None)
        except (RuntimeError, StopIteration):  # another thread changed it meanwhile
            break
