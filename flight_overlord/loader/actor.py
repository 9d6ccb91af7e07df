"""One loader actor: its share of a source (row groups), a bounded read-ahead buffer, and its journaled state.

Serving is a function of the request: any replica of the actor (the active one, its restart, a
shadow) can produce any sample it owns, from its buffer or by reading the row group again. What
is popped only decides when buffered row groups leave memory; it lives in a journal that every
replica appends to and follows (``LoaderState``), with a snapshot every ``checkpoint_every`` fetches.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import logging
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa

from .. import allocator
from ..core.order import RowGroupRef, stable_hash
from ..core.scaling import ActorSlots, Ownership
from ..core.vision import ImageError
from ..journal import Journal, Snapshots, read_journal
from ..wire.schemas import SAMPLE_METADATA, load_schema
from ..wire.status import LoaderActorStatus
from .read_ahead import ReadAheadPool
from .row_groups import RowGroupSamples, SourceShare
from .samples_table import samples_table
from .state import LoaderState

log = logging.getLogger(__name__)
# Served tables kept for a retried fetch (answered from the cache, else rebuilt: the same rows either
# way): the newest few, bounded in count and bytes per actor so 100s of actors stay small.
SERVED_KEPT, SERVED_BYTES = 8, 2 * 1024 * 1024
# Read a row group ahead of its demand once this share of the asked-for row groups' rows is served
# (_draining): every other slot at once, the others near the end, which comes first set by the actor
# (``read_ahead_phase``). Not one share for all: every actor starts at the start of a row group, in
# phase, and a row group lasts thousands of steps at 96 sources, so with one share every buffer would
# reach its long-run size together, only after ~10,000 steps (docs/methods/memory-peers.md, "Over time").
READ_AHEAD_AT = (0.0, 0.9)


class LoaderActor:
    def __init__(self, share: SourceShare, *, seed: int, read_ahead: int, run_dir: Path,
                 checkpoint_every: int = 50, read_ahead_bytes: int = 0, sample_level_bytes: int = 0,
                 replicated: bool = True, pool: ReadAheadPool | None = None):
        """``pool``: the read-ahead workers of the process hosting this actor (None: its own, one worker)."""
        self.share = share
        self.name = f"{share.source.name}[{share.actor}]"
        self.seed = seed
        self.read_ahead = read_ahead
        self.read_ahead_bytes = read_ahead_bytes  # 0: no byte bound; else read ahead only below it
        self.sample_level_bytes = sample_level_bytes  # text row groups of more token bytes: counts only (0: never)
        self.checkpoint_every = checkpoint_every
        # shadows write this actor's journal too (loader.shadows): follow it. Alone, it writes every record
        # itself and never re-reads it: reading it 5 times a second per actor would only churn the heap
        self.replicated = replicated
        self.phase = read_ahead_phase(share.source.name, share.actor)
        self.state = LoaderState()
        self._buffer: dict[int, RowGroupSamples] = {}  # slot -> read, transformed row group
        self._cond = threading.Condition()
        self._reading: set[int] = set()
        self._fatal: dict[int, str] = {}  # slots whose bad image must stop the run
        self._served: collections.OrderedDict[tuple[int, int, str], pa.Table] = collections.OrderedDict()
        self._slots: ActorSlots | None = None  # the slots this actor owns (core/scaling), per the segments
        self._served_bytes = 0  # of the tables in _served
        self._bytes_served = 0
        self._failed_reads = 0  # row groups skipped as unreadable (status, metrics)
        self._recent_failed_reads: list[str] = []  # the last few: "FILE row group G: error"
        self._stopping = False
        self.run_dir = run_dir
        directory = run_dir / "loaders" / f"{share.source.name}-{share.actor}"
        self._journal = Journal(directory / "journal.jsonl")
        self._snapshots = Snapshots(directory, "state", keep=2)  # a loader only ever restores its latest
        self._followed = 0  # journal offset folded in so far
        self._since_snapshot = 0
        self._snapshot_due: tuple[int, dict] | None = None  # (journal offset, snapshot) for the pool to write
        self._ahead_at = 0  # the next slot the read-ahead considers
        self._owns_pool = pool is None
        self._pool = pool or ReadAheadPool(workers=1)
        self._restore()  # builds the slots it owns from the restored segments (first _follow)
        self._sync_ownership()
        self._pool.add(self)

    # -- this actor's order: its slots of the source's read order, numbered 0, 1, 2, ... ----------
    # (with the configured actors only, slot p is row group p % n of epoch p // n of its own order;
    # a live reshard, ``loader.scaling``, appends ownership segments: see core/scaling.py)
    def _sync_ownership(self) -> None:
        """Follow the journaled segments: the slots this actor owns, anew after a reshard."""
        segments = self.state.segments or [[0, self.share.source.loaders]]
        if self._slots is not None and len(segments) == len(self._slots.ownership.segments):
            return
        owned = Ownership(self.share.catalog, seed=self.seed, source=self.share.source.name,
                          segments=segments).actor_slots(self.share.actor)
        if self._slots is not None:  # nothing read at or past the new segment may change hands (the Planner's
            first = owned.first_local_at(segments[-1][0])  # boundary guarantees it); drop it if it did
            dropped = [p for p in self._buffer if p >= first]
            for p in dropped:
                del self._buffer[p]
            if dropped or self.state.demanded >= first:
                log.error("loader %s: reshard at slot %d behind this actor's reads (local %d, demanded %d)",
                          self.name, segments[-1][0], first, self.state.demanded)
            log.info("loader %s: resharded: segments %s", self.name, segments)
        self._slots = owned

    def reshard(self, segments: list) -> None:
        """The Planner's ownership segments of this source (journaled, so replicas and restarts follow)."""
        with self._cond:
            if len(segments) <= len(self.state.segments or [[0, self.share.source.loaders]]):
                return
            known = self.state.segments or [[0, self.share.source.loaders]]
            if [list(map(int, s)) for s in segments[:len(known)]] != known:
                raise ValueError(f"reshard of loader {self.name}: segments {segments} do not extend {known}")
            self._record({"segments": [[int(f), int(a)] for f, a in segments]})

    def _at(self, slot: int) -> RowGroupRef | None:
        """The row group at local ``slot``; None past the end (a reclaimed actor owns no more)."""
        g = self._slots.global_slot(slot)
        return None if g is None else self._slots.ownership.row_group(g)

    def slot(self, epoch: int, file: str, row_group: int) -> int:
        for attempt in range(2):
            slot = self._slots.local(self._slots.ownership.slot(epoch, file, row_group))
            if slot is not None:
                return slot
            if attempt == 0:  # a reshard another replica journaled may not be folded in yet
                with self._cond:
                    self._follow()
        raise KeyError(f"row group {file}:{row_group} of epoch {epoch} is not owned by loader {self.name}")

    # -- journaled state ---------------------------------------------------------------
    def _restore(self) -> None:
        snapshot = self._snapshots.latest()
        if snapshot is not None:
            self.state.load_state_dict(snapshot[1]["state"])
            self._followed = snapshot[1]["journal_offset"]
        self._follow()
        if snapshot is not None or self._followed:
            log.info("loader %s restored: demanded %d, %d slots released", self.name, self.state.demanded,
                     self.state.released_below + len(self.state.released))

    def _record(self, record: dict) -> None:
        """Journal a change, then apply it here (the other replicas pick it up by following)."""
        self._journal.append(record)
        touched = self.state.apply(record)
        self._release_emptied(touched)
        self._sync_ownership()
        self._pool.poke(self)  # a demand, a fetch, a release or a reshard may let it read ahead

    def _follow(self) -> None:
        touched, followed = [], self._followed
        for end, record in read_journal(self._journal.path, self._followed):
            touched += self.state.apply(record)
            self._followed = end
        self._release_emptied(touched)
        self._sync_ownership()
        if self._followed != followed:  # another replica's demand, fetch or reshard
            self._pool.poke(self)

    def follow_now(self) -> None:
        """Fold in what the other replicas journaled (the pool's ticker, every ``FOLLOW_SECONDS``)."""
        with self._cond:
            if not self._stopping:
                self._follow()

    def _release_emptied(self, slots) -> None:
        for slot in slots:
            buffered = self._buffer.get(slot)
            if buffered is None:
                continue
            buffered.remaining[list(self.state.popped.get(slot, ()))] = False
            if not buffered.remaining.any():
                del self._buffer[slot]
                allocator.trim_now_and_then()  # the freed row group goes back to the system
                if not self.state.is_released(slot):
                    self._journal.append({"release": slot})
                    self.state.release(slot)

    def _maybe_snapshot(self) -> None:
        """Every ``checkpoint_every`` fetches, the state as of the journal's end, taken now and written by
        the read-ahead pool, off the fetch's path: at 96 sources two actors a step snapshot, and writing
        their files would be a quarter of a samples call. A crash before it is written replays more of the journal."""
        self._since_snapshot += 1
        if self._since_snapshot >= self.checkpoint_every:
            self._since_snapshot = 0
            self._follow()
            self._snapshot_due = (self._followed, {"state": self.state.state_dict(), "journal_offset": self._followed})
            self._pool.poke(self)

    def _write_due_snapshot(self) -> None:
        with self._cond:
            due, self._snapshot_due = self._snapshot_due, None
        if due is not None:
            self._snapshots.write(*due)

    # -- buffering ---------------------------------------------------------------------
    def read_ahead_once(self) -> bool:
        """One turn of the read-ahead (the pool's workers): read the next row group ahead of the demand if
        the buffer allows it now. True: it may allow another now; False: wait to be poked (``_record``)."""
        self._write_due_snapshot()
        with self._cond:
            slot = self._next_to_read(self._ahead_at)
            if self._stopping or not (slot <= self.state.demanded + self.read_ahead and self._under_byte_bound()
                                      and self._draining(slot)):
                return False
            # read ahead of the furthest demand only: what lies behind it is read when asked for,
            # so a far demand (a bad request, or a jump) never makes this read everything between
            if self._at(slot) is None:  # past all this actor owns (reclaimed, or idle): until a reshard
                return False
            skip = self.state.is_released(slot) or slot in self._buffer
            self._ahead_at = slot + 1
        if not skip:
            self._ensure(slot)
        return True

    def _next_to_read(self, slot: int) -> int:
        return max(slot, self.state.released_below, self.state.demanded + 1)

    def read_ahead_at(self, slot: int) -> float:
        """The share of the asked-for rows served before ``slot`` is read ahead (``READ_AHEAD_AT``)."""
        return READ_AHEAD_AT[(slot + self.phase) % 2]

    def _draining(self, slot: int) -> bool:
        """Read ``slot`` ahead once ``read_ahead_at(slot)`` of the rows of the row groups the
        Planner has asked for are served, not always as soon as it asks: a row group lasts many steps
        where a step takes a few rows of each of many sources, and row groups read at once would be half
        of such a loader's buffer (docs/methods/memory-peers.md). Half the slots are read at once,
        the others when 90 % are served: about as much held ahead as with one share of 0.5, but from
        the first step on, as it does not depend on how far into its row group an actor is (every
        actor starts at one's start). Nothing asked for yet (start-up): at once."""
        share = self.read_ahead_at(slot)
        if share == 0:  # no need to count the buffer's rows (under the lock, at every wake-up)
            return True
        rows = served = 0
        for buffered_at, buffered in self._buffer.items():
            if buffered_at <= self.state.demanded:
                rows += len(buffered.remaining)
                served += len(buffered.remaining) - int(np.count_nonzero(buffered.remaining))
        return served >= share * rows

    def _under_byte_bound(self) -> bool:
        """``loader.read_ahead_bytes``: read ahead only while what is buffered is below it (a row group
        the Planner asks for is always read; only the reading ahead of its demand waits)."""
        return not self.read_ahead_bytes or sum(b.nbytes for b in self._buffer.values()) < self.read_ahead_bytes

    def _ensure(self, slot: int) -> RowGroupSamples:
        """The row group at ``slot``: from the buffer, or read now. A released one (every row
        served before) is read again for a retried or replayed request, and not kept."""
        with self._cond:
            self._cond.wait_for(lambda: slot not in self._reading)
            if slot in self._buffer:
                return self._buffer[slot]
            self._reading.add(slot)
        try:
            samples = self._read(slot)
        finally:
            with self._cond:
                self._reading.discard(slot)
                self._cond.notify_all()
        with self._cond:
            if not self.state.is_released(slot):
                samples.remaining[list(self.state.popped.get(slot, ()))] = False
                self._buffer[slot] = samples
                self._release_emptied([slot])
        return samples

    def _read(self, slot: int) -> RowGroupSamples:
        rg = self._at(slot)
        try:
            samples = self.share.read(rg)
            if (self.sample_level_bytes and samples.images is None and samples.loss_mask is None and not samples.failed
                    and samples.tokens.nbytes > self.sample_level_bytes):
                return samples.sample_level(functools.partial(self.share.read_rows, rg))
            return samples
        except ImageError as exc:  # vision.on_bad_image: fail -> whoever asks for this row group gets the error
            log.error("source %s: %s; the run stops (vision.on_bad_image: fail)", self.share.source.name, exc)
            self._fatal[slot] = str(exc)
        except Exception as exc:  # a corrupt row group must not kill the loader: skip it, loudly
            log.error("source %s: cannot read %s row group %d: %s; its %d samples are skipped",
                      self.share.source.name, rg.file, rg.row_group, exc, rg.num_rows)
            with self._cond:
                self._failed_reads += 1
                self._recent_failed_reads = [*self._recent_failed_reads[-4:],
                                             f"{rg.file} row group {rg.row_group}: {type(exc).__name__}: {exc}"[:300]]
        return RowGroupSamples.failed_read(self.share.source.name, rg)

    def _checked(self, slot: int) -> RowGroupSamples:
        samples = self._ensure(slot)
        if slot in self._fatal:
            raise RuntimeError(self._fatal[slot])
        return samples

    # -- requests ----------------------------------------------------------------------
    def metadata(self, epoch: int, file: str, row_group: int, segments: list | None = None) -> pa.Table:
        """Every row's metadata of one row group (what the Planner plans with); moves the read-ahead on.
        ``segments``: the source's ownership after a live reshard (the Planner sends them along)."""
        if segments:
            self.reshard(segments)
        slot = self.slot(epoch, file, row_group)
        with self._cond:
            if slot > self.state.demanded:
                self._record({"demand": slot})
        return pa.Table.from_batches([self._checked(slot).metadata()]).cast(load_schema(SAMPLE_METADATA))

    def samples(self, step: int, constructor: int, wanted: list[list]) -> pa.Table:
        """The named samples, in order; their pop is journaled (idempotent, so a retry is harmless)."""
        cache_key = (step, constructor, hashlib.blake2b(repr(wanted).encode(), digest_size=16).digest())
        with self._cond:
            if cache_key in self._served:
                return self._served[cache_key]
        table = samples_table(self.pick(step, constructor, wanted))
        with self._cond:
            if cache_key not in self._served:  # (a concurrent retry may have served it meanwhile)
                self._served[cache_key] = table
                self._served_bytes += table.nbytes
            while len(self._served) > 1 and (len(self._served) > SERVED_KEPT or self._served_bytes > SERVED_BYTES):
                self._served_bytes -= self._served.popitem(last=False)[1].nbytes
        self.count_served(table.nbytes)
        return table

    def pick(self, step: int, constructor: int, wanted: list[list]) -> list[tuple[RowGroupSamples, int]]:
        """The named samples' (row group, row), in order, their pop journaled: ``samples`` without the
        table, for a loader process that builds one table for the samples of all its actors at once."""
        parts, rows = [], []
        groups: dict[tuple, tuple[int, RowGroupSamples]] = {}  # a request names few row groups, many rows each
        for epoch, file, row_group, row, *rest in wanted:
            group = groups.get((epoch, file, row_group))
            if group is None:
                slot = self.slot(epoch, file, row_group)
                group = groups[(epoch, file, row_group)] = (slot, self._checked(slot))
            slot, buffered = group
            if not 0 <= row < len(buffered.keys) or (buffered.bad is not None and buffered.bad[row]) or buffered.failed:
                raise KeyError(f"sample {[epoch, file, row_group, row]} is not servable by loader {self.name}")
            parts.append((buffered, row))
            rows.append([slot, row, rest[0] if rest else 1])
        with self._cond:
            self._record({"fetch": step, "constructor": constructor, "rows": rows})
            self._maybe_snapshot()
        return parts

    def count_served(self, nbytes: int) -> None:
        with self._cond:
            self._bytes_served += nbytes

    def buffer_metadata(self) -> pa.Table:
        """What this loader holds right now (samples not yet popped), for inspection."""
        with self._cond:
            batches = [b.metadata().filter(pa.array(b.remaining)) for b in self._buffer.values() if not b.failed]
        schema = load_schema(SAMPLE_METADATA)
        return pa.Table.from_batches(batches).cast(schema) if batches else schema.empty_table()

    def buffered_samples(self) -> int:
        with self._cond:
            return int(sum(b.remaining.sum() for b in self._buffer.values()))

    def status(self) -> LoaderActorStatus:
        with self._cond:
            return LoaderActorStatus(
                source=self.share.source.name, actor=self.share.actor,
                row_groups_owned=self._slots.owned_per_epoch(), segments=self._slots.ownership.to_list(),
                buffered_row_groups=len(self._buffer),
                buffered_samples=int(sum(b.remaining.sum() for b in self._buffer.values())),
                buffered_bytes=int(sum(b.nbytes for b in self._buffer.values())),
                bytes_served=self._bytes_served, demanded=self.state.demanded,
                released_below=self.state.released_below, failed_reads=self._failed_reads,
                recent_failed_reads=list(self._recent_failed_reads))

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._pool.remove(self)
        if self._owns_pool:
            self._pool.close()
        self.share.close()
        self._journal.close()


def read_ahead_phase(source: str, actor: int) -> int:
    """0 or 1, a function of the actor alone (no random state, the same in every replica and restart):
    which slots it reads ahead at once (``READ_AHEAD_AT``); over many actors, about half of each."""
    return stable_hash(source, actor) & 1
