"""Source Loader: reads its partition of one source ahead into a bounded buffer and serves it.

Two kinds of ``do_get`` ticket:
- ``{"kind": "metadata", "epoch": e, "file": f, "row_group": g}`` (from the Planner): make
  sure that row group is buffered for epoch ``e`` and stream its samples' metadata.
- ``{"kind": "samples", "step": s, "constructor": c, "samples": [[e, f, g, row], ...]}``
  (from a Data Constructor): pop those samples from the buffer and stream them.
- ``{"kind": "buffer"}`` (anyone): the metadata of every buffered, not yet popped sample.

A background reader keeps the next ``read_ahead_row_groups`` row groups (in this actor's
seeded order, past the furthest one the Planner asked for) buffered, so the Planner's
requests are answered from memory. Buffered row groups leave memory once every row has
been popped.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import logging
import threading

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from .. import wire
from ..wire.server import ActionServer, location_of, retry, serve
from ..config import load_config
from ..core.order import RowGroupRef, epoch_order
from ..core.vision import ImageError
from ..wire.schemas import SAMPLE_METADATA, SAMPLES, load_schema
from .partition import RowGroupSamples, SourcePartition

log = logging.getLogger(__name__)
BufferKey = tuple[int, str, int]  # (epoch, file, row_group)


class LoaderServer(ActionServer):
    def __init__(self, partition: SourcePartition, *, seed: int, read_ahead: int, host: str = "127.0.0.1", port: int = 0):
        # State first: Flight may accept calls during super().__init__.
        self.partition = partition
        self.seed = seed
        self.read_ahead = read_ahead
        self._buffer: dict[BufferKey, RowGroupSamples] = {}
        self._cond = threading.Condition()
        self._demanded = -1  # furthest position (in this actor's infinite order) asked for
        self._reading: set[BufferKey] = set()
        self._read: set[int] = set()  # positions read (buffered, or buffered and consumed since)
        self._served: collections.OrderedDict[tuple[int, int], pa.Table] = collections.OrderedDict()
        self._stopping = False
        self._epoch_orders: dict[int, list[RowGroupRef]] = {}
        self._index_in_epoch: dict[int, dict[tuple[str, int], int]] = {}
        self._bytes_served = 0  # Arrow bytes of the samples sent to constructors (retries not counted)
        self._fatal: dict[BufferKey, str] = {}
        self._pending: dict[tuple[BufferKey, int], int] = {}  # (row group, row) -> fetches still to come  # row groups whose bad image must stop the run
        super().__init__(f"grpc://{host}:{port}")
        self._reader = threading.Thread(target=self._read_ahead_loop, name="read-ahead", daemon=True)
        self._reader.start()

    # -- this actor's order: position p is row group p % n of epoch p // n -------------
    def _order(self, epoch: int) -> list[RowGroupRef]:
        if epoch not in self._epoch_orders:
            order = epoch_order(self.partition.row_groups, seed=self.seed, source=self.partition.source.name, epoch=epoch)
            self._epoch_orders[epoch] = order
            self._index_in_epoch[epoch] = {(rg.file, rg.row_group): i for i, rg in enumerate(order)}
        return self._epoch_orders[epoch]

    def _at(self, position: int) -> tuple[BufferKey, RowGroupRef]:
        n = len(self.partition.row_groups)
        epoch, index = divmod(position, n)
        rg = self._order(epoch)[index]
        return (epoch, rg.file, rg.row_group), rg

    def _position(self, key: BufferKey) -> int:
        epoch, file, row_group = key
        self._order(epoch)
        index = self._index_in_epoch[epoch].get((file, row_group))
        if index is not None:
            return epoch * len(self.partition.row_groups) + index
        raise KeyError(f"row group {file}:{row_group} is not owned by loader "
                       f"{self.partition.source.name}[{self.partition.actor}]")

    # -- buffering ---------------------------------------------------------------------
    def _read_ahead_loop(self) -> None:
        for position in itertools.count():
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or position <= self._demanded + self.read_ahead)
                if self._stopping:
                    return
                # Positions behind this loop are never read again: forget the consumed ones.
                self._read = {p for p in self._read if p >= position or self._at(p)[0] in self._buffer}
            self._ensure(position)

    def _ensure(self, position: int) -> RowGroupSamples | None:
        """The buffered row group at ``position``, read now if the read-ahead has not got there;
        None if it was read and every row has been popped since."""
        key, rg = self._at(position)
        with self._cond:
            self._cond.wait_for(lambda: key not in self._reading)
            if position in self._read:
                return self._buffer.get(key)
            self._reading.add(key)
        try:
            samples = self.partition.read(rg)
        except ImageError as exc:  # vision.on_bad_image: fail -> whoever asks for this row group gets the error
            log.error("source %s: %s; the run stops (vision.on_bad_image: fail)", self.partition.source.name, exc)
            samples = RowGroupSamples.failed_read(self.partition.source.name, rg)
            self._fatal[key] = str(exc)
        except Exception as exc:  # a corrupt row group must not kill the loader: skip it, loudly
            log.error("source %s: cannot read %s row group %d: %s; its %d samples are skipped",
                      self.partition.source.name, rg.file, rg.row_group, exc, rg.num_rows)
            samples = RowGroupSamples.failed_read(self.partition.source.name, rg)
        with self._cond:
            self._reading.discard(key)
            self._read.add(position)
            self._buffer[key] = samples
            self._cond.notify_all()
        return samples

    def _buffered(self, epoch: int, file: str, row_group: int) -> tuple[int, RowGroupSamples]:
        position = self._position((epoch, file, row_group))
        buffered = self._ensure(position)
        if (epoch, file, row_group) in self._fatal:
            raise RuntimeError(self._fatal[(epoch, file, row_group)])
        if buffered is None:
            raise KeyError(f"row group {file}:{row_group} of epoch {epoch} was already delivered")
        return position, buffered

    # -- Flight ------------------------------------------------------------------------
    def do_get(self, context, ticket):
        request = wire.decode(ticket.ticket, "ticket")
        kind = request.get("kind")
        if kind == "metadata":
            return fl.RecordBatchStream(self._metadata(request))
        if kind == "samples":
            return fl.RecordBatchStream(self._pop(request))
        if kind == "buffer":
            return fl.RecordBatchStream(self._buffer_metadata())
        raise ValueError(f"malformed ticket: unknown kind {kind!r} (loader tickets: 'metadata', 'samples', 'buffer')")

    def _buffer_metadata(self) -> pa.Table:
        """What this loader holds right now (samples not yet popped), for inspection."""
        with self._cond:
            batches = [b.metadata().filter(pa.array(b.remaining)) for b in self._buffer.values() if not b.failed]
        schema = load_schema(SAMPLE_METADATA)
        return pa.Table.from_batches(batches).cast(schema) if batches else schema.empty_table()

    def _metadata(self, request: dict) -> pa.Table:
        position, buffered = self._buffered(wire.field(request, "epoch", int, "metadata ticket"),
                                            wire.field(request, "file", str, "metadata ticket"),
                                            wire.field(request, "row_group", int, "metadata ticket"))
        with self._cond:
            self._demanded = max(self._demanded, position)
            self._cond.notify_all()
        return pa.Table.from_batches([buffered.metadata()]).cast(load_schema(SAMPLE_METADATA))

    def _pop(self, request: dict) -> pa.Table:
        step = wire.field(request, "step", int, "samples ticket")
        constructor = wire.field(request, "constructor", int, "samples ticket")
        wanted = wire.field(request, "samples", list, "samples ticket")
        for item in wanted:
            if not (isinstance(item, list) and len(item) in (4, 5) and isinstance(item[1], str)
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in item[:1] + item[2:])):
                raise ValueError(f"malformed samples ticket: sample {item!r} is not "
                                 f"[epoch, file, row_group, row] or [epoch, file, row_group, row, consumers]")
        with self._cond:
            if (step, constructor) in self._served:  # a retried fetch gets the same samples again
                return self._served[(step, constructor)]
        parts = []
        for item in wanted:
            _, buffered = self._buffered(*item[:3])
            row = item[3]
            if not 0 <= row < len(buffered.keys) or not buffered.remaining[row]:
                raise KeyError(f"sample {item} is not in the buffer of loader "
                               f"{self.partition.source.name}[{self.partition.actor}] (already delivered?)")
            parts.append((buffered, row))
        table = self._samples_table(parts)
        self._release(wanted)
        with self._cond:
            self._served[(step, constructor)] = table
            self._bytes_served += table.nbytes
            while len(self._served) > 64:
                self._served.popitem(last=False)
        return table

    @staticmethod
    def _samples_table(parts: list[tuple[RowGroupSamples, int]]) -> pa.Table:
        """The requested rows, in ticket order: one ``take`` per row group, then one reorder."""
        groups: dict[int, tuple[RowGroupSamples, list[int], list[int]]] = {}
        for position, (buffered, row) in enumerate(parts):
            _, rows, positions = groups.setdefault(id(buffered), (buffered, [], []))
            rows.append(row)
            positions.append(position)
        schema = load_schema(SAMPLES)
        tables, order = [], []
        for buffered, rows, positions in groups.values():
            indices = pa.array(rows, pa.int32())

            def taken(values: pa.ListArray | None, value_type: pa.DataType) -> pa.ListArray:
                if values is not None:
                    return values.take(indices)
                return pa.ListArray.from_arrays(pa.array(np.zeros(len(rows) + 1, np.int32)), pa.array([], value_type))
            tables.append(pa.table({
                "key": pa.array([buffered.keys[r] for r in rows], pa.string()),
                "tokens": buffered.tokens.take(indices),
                "images": taken(buffered.images, pa.binary()),   # text sources: empty lists
                "image_grids": taken(buffered.grids, pa.int32()),
            }, schema=schema))
            order.extend(positions)
        if not tables:
            return schema.empty_table()
        table = pa.concat_tables(tables)
        return table.take(pa.array(np.argsort(order), pa.int64())) if len(tables) > 1 else table

    def _release(self, wanted: list) -> None:
        """Pop what was fetched. A sample several constructors fetch (its images encoded on another
        constructor's rank) stays until the last of them has it."""
        with self._cond:
            for epoch, file, row_group, row, *rest in wanted:
                key = (epoch, file, row_group)
                consumers = rest[0] if rest else 1
                if consumers > 1:
                    left = self._pending.get((key, row), consumers) - 1
                    if left > 0:
                        self._pending[(key, row)] = left
                        continue
                    self._pending.pop((key, row), None)
                buffered = self._buffer[key]
                buffered.remaining[row] = False
                if not buffered.remaining.any():
                    del self._buffer[key]

    def list_flights(self, context, criteria):
        source = self.partition.source.name
        descriptor = fl.FlightDescriptor.for_path("source", source, str(self.partition.actor))
        schema = load_schema(SAMPLE_METADATA)
        yield fl.FlightInfo(schema, descriptor, [], self._buffered_samples(), -1)

    def _buffered_samples(self) -> int:
        with self._cond:
            return int(sum(b.remaining.sum() for b in self._buffer.values()))

    def action_status(self, body):
        """Buffer occupancy of this loader."""
        with self._cond:
            return {"source": self.partition.source.name, "actor": self.partition.actor,
                    "row_groups_owned": len(self.partition.row_groups),
                    "buffered_row_groups": len(self._buffer),
                    "buffered_samples": int(sum(b.remaining.sum() for b in self._buffer.values())),
                    "buffered_bytes": int(sum(b.nbytes for b in self._buffer.values())),
                    "bytes_served": self._bytes_served}

    def shutdown(self):
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        super().shutdown()
        self.partition.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="overlord serve loader")
    parser.add_argument("--config", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--actor", type=int, default=0)
    parser.add_argument("--planner", required=True, help="grpc://host:port of the Planner")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    partition = SourcePartition(cfg.source(args.source), args.actor, cfg.global_batch.context_length, cfg.vision)
    server = LoaderServer(partition, seed=cfg.seed, read_ahead=cfg.read_ahead_row_groups, host=cfg.host, port=args.port)
    location = location_of(server, cfg.host)
    planner = fl.connect(args.planner)
    retry(lambda: wire.call(planner, "register", {
        "role": "loader", "source": args.source, "actor": args.actor, "location": location,
        "row_groups": [[rg.file, rg.row_group, rg.num_rows] for rg in partition.row_groups],
    }), attempts=50, delay=0.2, what="planner")
    serve(server, location, args.ready_file)
