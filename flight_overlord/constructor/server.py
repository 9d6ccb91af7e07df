"""Data Constructor: assembles the microbatches of its data-parallel ranks, step by step.

An assembly thread asks the Planner for its share of each step's plan, fetches the samples
from every loader concurrently, packs each microbatch to the plan's capacity, and stages one
table per distinct delivery: a bucket's full sequences, each context-parallel rank's share of
them, or metadata only (ClientPlaceTree rules, ``core/mesh.py``). Trainers redeem
``{"kind": "batch", "step", "rank"}`` tickets with ``do_get``; the table streams from C++.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import logging
import threading

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from .. import wire
from ..config import Config, load_config
from ..core.context_parallel import take_ranges, token_ranges
from ..core.mesh import Delivery, Mesh
from ..core.packing import PackedSequence, pack
from ..schemas import MICROBATCH, load_schema

log = logging.getLogger(__name__)
WAIT_SECONDS = 30.0


def _list_column(rows: list[np.ndarray], dtype=pa.int32()) -> pa.ListArray:
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    values = np.concatenate(rows) if rows else np.zeros(0, np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, dtype))


def pack_bucket(microbatches: list[list[int]], keys: list[str], tokens: dict[int, np.ndarray],
                capacity: int, pad_token_id: int) -> tuple[list[PackedSequence], list[list[str]]]:
    """One bucket's step: each microbatch packed into one sequence of ``capacity`` tokens."""
    packed = [pack([tokens[i] for i in mb], capacity, pad_token_id) for mb in microbatches]
    return packed, [[keys[i] for i in mb] for mb in microbatches]


def microbatch_table(step: int, bucket: int, packed: list[PackedSequence], keys: list[list[str]],
                     ranges: list[int], capacity: int) -> pa.Table:
    n = len(packed)
    columns = {
        "step": pa.array(np.full(n, step, dtype=np.int64)),
        "bucket": pa.array(np.full(n, bucket, dtype=np.int32)),
        "microbatch": pa.array(np.arange(n, dtype=np.int32)),
        "input_ids": _list_column([take_ranges(p.input_ids, ranges) if ranges else p.input_ids[:0] for p in packed]),
        "position_ids": _list_column([take_ranges(p.position_ids, ranges) if ranges else p.position_ids[:0]
                                      for p in packed]),
        "token_ranges": _list_column([np.array(ranges, dtype=np.int32)] * n),
        "sequence_length": pa.array(np.full(n, capacity, dtype=np.int32)),
        "cu_seqlens": _list_column([p.cu_seqlens for p in packed]),
        "sample_keys": pa.ListArray.from_arrays(
            pa.array(np.cumsum([0] + [len(k) for k in keys], dtype=np.int32)),
            pa.array([k for mb in keys for k in mb], pa.string())),
        "num_tokens": pa.array(np.array([p.num_tokens for p in packed], dtype=np.int32)),
    }
    return pa.table(columns, schema=load_schema(MICROBATCH))


def delivery_ranges(delivery: Delivery, length: int, cp: int, cp_split: str) -> list[int]:
    """The positions of a packed sequence that a rank with this delivery receives."""
    if not delivery.tokens:
        return []
    if delivery.cp_rank is None:
        return [0, length]
    return token_ranges(length, cp, delivery.cp_rank, cp_split)


class ConstructorServer(wire.ActionServer):
    def __init__(self, cfg: Config, index: int, planner: str, *, port: int = 0):
        self.cfg = cfg
        self.index = index
        self.mesh = Mesh.from_config(cfg.mesh, cfg.dp_per_constructor)
        if not 0 <= index < self.mesh.num_constructors:
            raise ValueError(f"constructor index {index} out of range (mesh has {self.mesh.num_constructors})")
        self.dp_ranks = self.mesh.dp_ranks_of(index)
        self.ranks = [r for r in range(self.mesh.world_size) if self.mesh.coord(r).dp in self.dp_ranks]
        self._planner_location = planner
        self._clients = wire.ClientPool()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="fetch")
        self._cond = threading.Condition()
        self._deliveries: dict[int, Delivery] = {}  # rank -> what it receives; known from the first plan
        self._staged: dict[tuple[int, tuple], pa.Table] = {}  # (step, delivery key) -> table
        self._served: dict[int, int] = {}  # rank -> last step served
        self._assembled = -1
        self._error: str | None = None
        self._stopping = False
        super().__init__(f"grpc://{cfg.host}:{port}")

    def start(self) -> None:
        threading.Thread(target=self._assemble_loop, name="assemble", daemon=True).start()

    # -- assembly ----------------------------------------------------------------------
    def _assemble_loop(self) -> None:
        planner = self._clients.get(self._planner_location)
        try:
            for step in itertools.count():
                view = self._plan(planner, step)
                if view is None:
                    return
                tables = self._assemble(step, view, self._fetch(step, view))
                with self._cond:
                    self._staged.update(tables)
                    self._assembled = step
                    self._cond.notify_all()
        except Exception as exc:
            log.exception("assembly failed")
            with self._cond:
                self._error = f"constructor {self.index}: assembly failed: {type(exc).__name__}: {exc}"
                self._cond.notify_all()

    def _assemble(self, step: int, view: dict, tokens: dict[int, np.ndarray]) -> dict:
        """Pack each bucket once, then cut one table per distinct delivery of its ranks."""
        if not self._deliveries:
            broadcast = frozenset(view["broadcast"])
            self._deliveries = {r: self.mesh.delivery(r, view["axis"], broadcast) for r in self.ranks}
        capacity = view["capacity"]
        lengths = view["lengths"]
        tokens = {i: t[:lengths[i]] for i, t in tokens.items()}  # the plan may truncate to the capacity
        tables = {}
        for bucket, microbatches in view["microbatches"].items():
            packed, keys = pack_bucket(microbatches, view["keys"], tokens, capacity, self.cfg.pad_token_id)
            for delivery in {d for d in self._deliveries.values() if d.bucket == int(bucket)}:
                ranges = delivery_ranges(delivery, capacity, self.mesh.cp, self.cfg.mesh.cp_split)
                tables[(step, delivery.key)] = microbatch_table(step, int(bucket), packed, keys, ranges, capacity)
        return tables

    def _plan(self, planner: fl.FlightClient, step: int) -> dict | None:
        while not self._stopping:
            try:
                return wire.call(planner, "plan", {"step": step, "constructor": self.index})
            except fl.FlightTimedOutError:
                continue  # trainers have not moved on yet: the Planner plans only ahead of them
        return None

    def _fetch(self, step: int, view: dict) -> dict[int, np.ndarray]:
        """Every loader's samples for this step, concurrently; item index -> tokens."""
        def one(entry):
            request = {"kind": "samples", "step": step, "constructor": self.index, "samples": entry["samples"]}
            table = self._clients.get(entry["location"]).do_get(wire.ticket(request)).read_all()
            column = table.column("tokens").combine_chunks()
            offsets = column.offsets.to_numpy()
            values = column.values.to_numpy()
            return {item: values[offsets[j]:offsets[j + 1]] for j, item in enumerate(entry["items"])}

        tokens: dict[int, np.ndarray] = {}
        for part in self._pool.map(one, view["fetch"]):
            tokens.update(part)
        return tokens

    # -- Flight ------------------------------------------------------------------------
    def do_get(self, context, ticket):
        request = wire.decode(ticket.ticket, "ticket")
        if request.get("kind") != "batch":
            raise ValueError(f"malformed ticket: kind {request.get('kind')!r}, a constructor serves 'batch' tickets")
        step = wire.field(request, "step", int, "batch ticket")
        rank = wire.field(request, "rank", int, "batch ticket")
        if rank not in self.ranks:
            raise KeyError(f"rank {rank} is not served by constructor {self.index} "
                           f"(it serves the ranks of data-parallel groups {list(self.dp_ranks)})")
        with self._cond:
            wire.wait_until(self._cond, lambda: self._error is not None or step <= self._assembled,
                            WAIT_SECONDS, f"step {step} of rank {rank}")
            if self._error:
                raise RuntimeError(self._error)
            key = (step, self._deliveries[rank].key)
            if key not in self._staged:
                raise KeyError(f"step {step} of rank {rank} was already served and released")
            table = self._staged[key]
            self._release(rank, step)
        return fl.RecordBatchStream(table)

    def _release(self, rank: int, step: int) -> None:
        """Keep a step until every rank reading from this constructor has moved two steps past it
        (so a retried fetch still finds it)."""
        self._served[rank] = max(step, self._served.get(rank, -1))
        if len(self._served) < len(self.ranks):
            return
        done = min(self._served.values()) - 2
        for key in [k for k in self._staged if k[0] <= done]:
            del self._staged[key]

    def action_status(self, body):
        """Assembly progress and staged steps."""
        with self._cond:
            return {"index": self.index, "dp_ranks": list(self.dp_ranks), "assembled": self._assembled,
                    "staged_steps": sorted({k[0] for k in self._staged}), "error": self._error}

    def shutdown(self):
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        super().shutdown()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._clients.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="overlord serve constructor")
    parser.add_argument("--config", required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--planner", required=True, help="grpc://host:port of the Planner")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    server = ConstructorServer(cfg, args.index, args.planner, port=args.port)
    location = wire.location_of(server, cfg.host)
    planner = fl.connect(args.planner)
    wire.retry(lambda: wire.call(planner, "register", {"role": "constructor", "index": args.index,
                                                       "location": location}),
               attempts=50, delay=0.2, what="planner")
    server.start()
    wire.serve(server, location, args.ready_file)
