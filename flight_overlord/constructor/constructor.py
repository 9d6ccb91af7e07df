"""The Data Constructor's logic, without Flight: its assembly loop (``run``, ``loop.py``: plans and
samples from two small protocols), one staged table per distinct delivery of its ranks, and handing
them out.

- ``assemble(step, plan, samples)``: each bucket's microbatches built once, then one table per
  distinct delivery (full sequences, a context-parallel share, or metadata only);
- ``stage``: staged tables until every stream reading from here has them;
- ``rank_stream``: one rank's tables step after step, the one way they are handed out (``take``, a
  per-step ticket, is its one-step slice), and ``paced`` / ``positions``: where those streams are, so
  assembly asks for a plan only when a stream nears its step.

State (``state_dict``) is plain numbers: the next step to assemble, what each stream was served,
and the counters its status reports. One lock (``cond``) guards it.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from ..config import Config
from ..core.mesh import Delivery
from ..core.starvation import StageTimeline
from ..errors import BackgroundFailure
from ..planner.strategy import Strategy
from ..waiting import Waiters
from ..wire.plan import ConstructorPlan
from ..wire.status import ConstructorStatus
from .assembly import build_microbatch, drop_bad, encoder_table, rank_table
from .hdp import hdp_rank_table
from .loop import AssemblyLoop, PlanSource, SampleSource
from .rebuilt import RebuiltSteps
from .staging import Staging

WAIT_SECONDS = 30.0  # a stream waits this long server-side for its first step, then its client asks again


class Constructor:
    def __init__(self, cfg: Config, index: int, strategy: Strategy, *, plans: PlanSource | None = None,
                 samples: SampleSource | None = None,
                 on_served: Callable[[int, int, int, list[str]], None] | None = None,
                 on_rewind: Callable[[int, int, int], None] | None = None):
        """Constructor ``index`` of the mesh; ``strategy``: for its ``constructor_do_plan`` hook;
        ``plans`` / ``samples``: where its loop (``run``) gets plans and samples; without them steps are
        assembled and staged by the caller, and a released step cannot be built again.
        ``on_served(step, rank, bucket, keys)``: told of every batch handed to a rank (the server records
        it for ``overlord audit``); ``on_rewind(rank, first, served)``: a rank's stream starts at
        ``first``, at or before ``served``, the last step it was served (recorded for the audit)."""
        self.cfg = cfg
        self.index = index
        self.mesh = strategy.mesh
        self.strategy = strategy
        if not 0 <= index < self.mesh.num_constructors:
            raise ValueError(f"constructor index {index} out of range (mesh has {self.mesh.num_constructors})")
        self.dp_ranks = self.mesh.dp_ranks_of(index)
        self.ranks = [r for r in range(self.mesh.world_size) if self.mesh.coord(r).dp in self.dp_ranks]
        self.cond = threading.Condition()
        self.waiters = Waiters()  # this server's blocking takes, bounded
        self.timeline = StageTimeline()  # what this constructor was doing while a rank waited (status)
        self._deliveries: dict[int, Delivery] = {}  # rank -> what it receives; known from the first plan
        self._encoder_axis: str | None = None  # the image graph's axis, if the plans have one
        # a reconnecting rank stream may ask again for steps lost in flight: keep prefetch more
        self.staging = Staging(streams=len(self.ranks), keep=2 + cfg.prefetch)
        self._positions: dict[int, int] = {}  # rank -> the next step its rank stream sends
        self.bytes_fetched = 0  # Arrow bytes received from loaders
        self._served: dict[int, dict] = {}  # rank -> {"step", "batches", "samples", "bytes"} (status, metrics)
        self._bad_samples: list[str] = []  # keys skipped for a bad image (vision.on_bad_image: skip)
        self.failure: BackgroundFailure | None = None  # assembly failed: every waiting take gets it
        self.stopping = False
        self._on_served = on_served
        self._on_rewind = on_rewind
        self._loop = AssemblyLoop(self, plans, samples) if plans is not None and samples is not None else None
        # a trainer restarted from a checkpoint asks for steps released here: each built again once
        self._rebuilt = RebuiltSteps(self._loop.assemble_again, keep=2 + cfg.prefetch) if self._loop else None

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        """The assembly loop (``loop.py``), until its sources stop; a failure reaches every take."""
        if self._loop is None:
            raise RuntimeError(f"constructor {self.index} has no plan and sample sources to assemble from")
        self._loop.run()

    def fetched(self, nbytes: int) -> None:
        """Arrow bytes received from a loader (status, metrics)."""
        with self.cond:
            self.bytes_fetched += nbytes

    # -- assembly ----------------------------------------------------------------------
    def assemble(self, step: int, plan: ConstructorPlan, samples: dict) -> dict:
        """Build each bucket's microbatches once, then cut one table per distinct delivery of its ranks."""
        if not self._deliveries:
            broadcast = frozenset(plan.broadcast)
            self._deliveries = {r: self.mesh.delivery(r, plan.axis, broadcast, self.strategy.stage_contents)
                                for r in self.ranks}
            self._encoder_axis = plan.encoder_axis
            readers = [r for r in self.ranks if self.mesh.reads(r, self.strategy.silent)]
            self.staging.silent = frozenset(self.ranks) - set(readers)
            self.staging.streams = len(readers) * (2 if plan.encoder_axis else 1)
        samples, bad = drop_bad(samples, self.cfg)
        self._bad_samples.extend(bad)
        image_token = self.cfg.vision.image_token_id if any(s.image_column for s in self.cfg.sources) else None
        tables = {}
        image_graph = plan.encoder is not None
        for bucket, bins in plan.microbatches.items():
            deliveries = {d for d in self._deliveries.values() if d.bucket == bucket}
            if plan.axis == "HDP":  # each sample a THD sequence of its own CP group (constructor/hdp.py)
                entries = [[(samples[i], size, first) for i, (size, first) in zip(mb, groups)]
                           for mb, groups in zip(bins, plan.extra["hdp"][str(bucket)])]
                for delivery in deliveries:
                    tables[(step, delivery.key)] = hdp_rank_table(step, bucket, entries, delivery, self.cfg)
                continue
            microbatches = [build_microbatch([samples[i] for i in mb if i in samples], plan.capacity, self.cfg,
                                             image_token, self.strategy.seq_multiple) for mb in bins]
            microbatches = self._ordered(step, bucket, microbatches)
            for delivery in deliveries:
                tables[(step, delivery.key)] = rank_table(step, bucket, microbatches, delivery, self.cfg,
                                                          with_pixels=not image_graph)
        for bucket, rows in (plan.encoder or {}).items():
            tables[(step, ("encoder", bucket))] = encoder_table(
                step, [(samples[i], image, owner, mb) for i, image, owner, mb in rows if i in samples])
        return tables

    def _ordered(self, step: int, bucket: int, microbatches: list) -> list:
        """The strategy's ``constructor_do_plan`` hook, if any: a checked permutation of the microbatches."""
        policy = self.strategy.constructor_policy
        if policy is None:
            return microbatches
        order = list(policy(step, bucket, [{"sample_keys": mb.keys, "num_tokens": mb.packed.num_tokens}
                                           for mb in microbatches]))
        if sorted(order) != list(range(len(microbatches))):
            raise ValueError(f"constructor_do_plan returned {order!r}: not a permutation of "
                             f"range({len(microbatches)}) (step {step}, bucket {bucket})")
        return [microbatches[i] for i in order]

    # -- staging and hand-out ----------------------------------------------------------
    def begin_at(self, step: int) -> None:
        with self.cond:
            self.staging.next_step = step

    def stage(self, step: int, tables: dict, stages: list[tuple] = ()) -> None:
        """Stage a step's tables; ``stages``: (start, end, name, shares) of what preparing it took
        (``core/starvation.py``), against which the ranks' waits are charged."""
        with self.cond:
            for start, end, name, shares in stages:
                self.timeline.stage(start, end, name, shares)
            self.staging.stage(step, tables)
            self.cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        """Assembly failed: every waiting and later ``take`` raises with this message."""
        with self.cond:
            self.failure = BackgroundFailure.of(f"constructor {self.index}: assembly failed", exc)
            self.cond.notify_all()

    def check_rank(self, rank: int) -> None:
        if rank not in self.ranks:
            raise KeyError(f"rank {rank} is not served by constructor {self.index} "
                           f"(it serves the ranks of data-parallel groups {list(self.dp_ranks)})")

    def take(self, kind: str, step: int, rank: int) -> pa.Table:
        """Rank ``rank``'s ``kind`` ("batch" or "encoder") table of ``step``: its stream of ``[step, step + 1)``
        (what a per-step ticket redeems), read whole."""
        schema, steps = self.rank_stream(rank, step, step + 1, kind)
        return pa.Table.from_batches(list(steps), schema)

    def _key(self, kind: str, step: int, rank: int) -> tuple:
        """(lock held) The staging key of a rank's ``kind`` table of ``step``."""
        if kind == "batch":
            return step, self._deliveries[rank].key
        return step, ("encoder", self.mesh.bucket_of(rank, self._encoder_axis or "WORLD"))

    def _served_table(self, kind: str, step: int, rank: int) -> pa.Table | None:
        """(lock held, step assembled) The staged table, counted as served; None when it was released
        already and can be built again (``_served_again``, outside the lock)."""
        if self._deliveries:
            key = self._key(kind, step, rank)
            if key in self.staging.tables:
                return self._count(kind, step, rank, self.staging.tables[key])
        if kind == "encoder" and self._deliveries and self._encoder_axis is None:
            raise KeyError("no encoder stream: this run's plans have no image graph")
        if self._rebuilt is None:
            raise KeyError(f"{kind} of step {step} for rank {rank} was already served and released")
        return None

    def _served_again(self, kind: str, step: int, rank: int) -> pa.Table:
        """A released step's table for a rank that went back to it, built again (the same table: the plan
        and the samples are the journaled ones), counted as served."""
        tables = self._rebuilt.tables(step)
        with self.cond:
            key = self._key(kind, step, rank)
            if key not in tables:
                raise KeyError(f"{kind} of step {step} for rank {rank}: not in the step's plan built again")
            return self._count(kind, step, rank, tables[key])

    def _count(self, kind: str, step: int, rank: int, table: pa.Table) -> pa.Table:
        """(lock held) ``table`` handed to ``rank``: counted (and journaled) as served."""
        self.staging.served(kind, rank, step)
        if kind == "batch":
            self._count_served(rank, step, table)
        return table

    def _wait_staged(self, kind: str, step: int, rank: int, later: bool) -> None:
        """Wait (lock held) for the step to be assembled; a stream's first step waits at most
        ``WAIT_SECONDS``, and that wait is its rank's (attributed); a later step waits as long as it takes
        (its trainer is the slowest, or planning waits), or until stop."""
        # a later step's wait is not its trainer's (the transport buffers ahead of it): not attributed
        since = time.monotonic() if kind == "batch" and not later and not self.staging.assembled(step) else None
        try:
            if later:
                self.cond.wait_for(lambda: self.failure is not None or self.stopping or self.staging.assembled(step))
            else:
                self.waiters.wait_until(self.cond, lambda: self.failure is not None or self.staging.assembled(step),
                                        WAIT_SECONDS, f"step {step} of rank {rank}")
        finally:
            if since is not None:
                self.timeline.waited(rank, since, time.monotonic())

    # -- rank streams ------------------------------------------------------------------
    def rank_stream(self, rank: int, first: int, end: int | None,
                    kind: str = "batch") -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        """Rank ``rank``'s ``kind`` ("batch", or "encoder": the images its vision encoder processes)
        tables from ``first`` on, one record batch per step, each counted (and journaled) as served when
        it is handed out; it ends at ``end`` or when this constructor stops. The first step waits at most
        ``WAIT_SECONDS`` (the client asks again), later ones as long as it takes.

        A batch stream that goes on past its first step is a trainer's: it reports where it is (its
        position paces assembly), and starting at or before the step last served is a rewind. A one-step
        slice (a per-step ticket, an inspection) continues nowhere, so it does neither: a stock client
        reading an old step neither holds assembly back nor rewinds the rank."""
        self.check_rank(rank)
        goes_on = kind == "batch" and (end is None or end > first + 1)
        if goes_on:
            self._note_rewind(rank, first)
        table = self._stream_take(kind, rank, first, goes_on, later=False)  # the schema comes with the first step
        if table is None:
            raise RuntimeError(f"constructor {self.index} is stopping: ask the Planner for rank {rank}'s stream again")

        def steps() -> Iterator[pa.RecordBatch]:
            step, current = first, table
            while current is not None:
                yield current
                step += 1
                current = (self._stream_take(kind, rank, step, goes_on, later=True) if end is None or step < end
                           else None)
        return table.schema, steps()

    def _stream_take(self, kind: str, rank: int, step: int, paces: bool, later: bool) -> pa.RecordBatch | None:
        """The rank's ``kind`` table of ``step`` as one record batch once assembled; None once this
        constructor stops (a stream then ends and its trainer asks the Planner again). ``paces``: the
        step is the rank's position while it waits; ``later``: a step after the stream's first."""
        with self.cond:
            if paces:
                self._positions[rank] = step
                self.cond.notify_all()
            self._wait_staged(kind, step, rank, later)
            if self.failure:
                raise BackgroundFailure(str(self.failure), self.failure.cause)
            if self.stopping:
                return None
            table = self._served_table(kind, step, rank)
        if table is None:
            table = self._served_again(kind, step, rank)
        # combine_chunks (a copy) outside the lock that assembly and the streams share
        batches = table.combine_chunks().to_batches()  # one record batch per step, even an empty one (no images)
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)

    def _note_rewind(self, rank: int, first: int) -> None:
        """A rank stream starting at or before the last step this rank was served goes back (a trainer
        restarted from a checkpoint, or a stream reopened with steps in flight): told to ``on_rewind``."""
        with self.cond:
            served = self._served.get(rank, {}).get("step", -1)
        if first <= served and self._on_rewind is not None:
            self._on_rewind(rank, first, served)

    def paced(self, step: int, timeout: float | None = None) -> bool | None:
        """Wait until every rank stream here is within ``prefetch`` steps of ``step`` (so the positions a
        plan request reports let the Planner plan it); False once this constructor stops, None when
        ``timeout`` seconds passed first."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.stopping or not self._positions
                                      or step <= min(self._positions.values()) + self.cfg.prefetch, timeout):
                return None
            return not self.stopping

    def positions(self) -> dict[str, int]:
        """rank -> the next step its rank stream sends (reported with every plan request)."""
        with self.cond:
            return {str(r): s for r, s in self._positions.items()}

    def _count_served(self, rank: int, step: int, table: pa.Table) -> None:
        served = self._served.setdefault(rank, {"step": -1, "batches": 0, "samples": 0, "bytes": 0})
        keys = table.column("sample_keys") if "sample_keys" in table.column_names else None
        served["step"] = max(served["step"], step)
        served["batches"] += 1
        served["samples"] += int(pc.sum(pc.list_value_length(keys)).as_py() or 0) if keys is not None else 0
        served["bytes"] += table.nbytes
        if keys is not None and self._on_served is not None:
            self._on_served(step, rank, self._deliveries[rank].bucket, pc.list_flatten(keys).to_pylist())

    # -- inspection and state ----------------------------------------------------------
    def status(self) -> ConstructorStatus:
        """Assembly progress, staged steps, and what each rank was served."""
        with self.cond:
            return ConstructorStatus(self.index, list(self.dp_ranks), self.staging.next_step - 1,
                                     self.staging.steps(), str(self.failure) if self.failure else None,
                                     list(self._bad_samples), self.bytes_fetched,
                                     {str(r): dict(s) for r, s in sorted(self._served.items())},
                                     waits={str(r): w for r, w in sorted(self.timeline.totals().items())})

    def state_dict(self) -> dict:
        with self.cond:
            return {"staging": self.staging.state_dict(), "bytes_fetched": self.bytes_fetched,
                    "served": {str(r): dict(s) for r, s in self._served.items()},
                    "bad_samples": list(self._bad_samples)}

    def load_state_dict(self, state: dict) -> None:
        with self.cond:
            self.staging.load_state_dict(state["staging"])
            self.bytes_fetched = int(state["bytes_fetched"])
            self._served = {int(r): dict(s) for r, s in state["served"].items()}
            self._bad_samples = list(state["bad_samples"])

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self._loop is not None:
            self._loop.close()
