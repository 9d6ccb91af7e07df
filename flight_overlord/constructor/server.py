"""Data Constructor: assembles the microbatches of its data-parallel ranks, step by step.

An assembly thread asks the Planner for its share of each step's plan, fetches the
samples from every loader concurrently, packs each microbatch to the context length and
stages one table per data-parallel rank. Trainers redeem ``{"kind": "batch", "step",
"rank", "dp"}`` tickets with ``do_get``; the table streams from C++ (RecordBatchStream).
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
from ..core.mesh import Mesh
from ..core.packing import pack
from ..schemas import MICROBATCH, load_schema

log = logging.getLogger(__name__)
WAIT_SECONDS = 30.0


def assemble(step: int, dp: int, microbatches: list[list[int]], keys: list[str],
             tokens: dict[int, np.ndarray], context_length: int, pad_token_id: int) -> pa.Table:
    """One rank's step: a row per microbatch, each one sequence packed to the context length."""
    packed = [pack([tokens[i] for i in mb], context_length, pad_token_id) for mb in microbatches]
    n = len(packed)
    fixed_offsets = pa.array(np.arange(n + 1, dtype=np.int32) * context_length)
    cu_lengths = np.array([len(p.cu_seqlens) for p in packed], dtype=np.int32)
    cu_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(cu_lengths, out=cu_offsets[1:])
    key_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum([len(mb) for mb in microbatches], out=key_offsets[1:])

    def concat(arrays):
        return pa.array(np.concatenate(arrays) if arrays else np.zeros(0, np.int32), pa.int32())

    columns = {
        "step": pa.array(np.full(n, step, dtype=np.int64)),
        "rank": pa.array(np.full(n, dp, dtype=np.int32)),
        "microbatch": pa.array(np.arange(n, dtype=np.int32)),
        "input_ids": pa.ListArray.from_arrays(fixed_offsets, concat([p.input_ids for p in packed])),
        "position_ids": pa.ListArray.from_arrays(fixed_offsets, concat([p.position_ids for p in packed])),
        "cu_seqlens": pa.ListArray.from_arrays(pa.array(cu_offsets), concat([p.cu_seqlens for p in packed])),
        "sample_keys": pa.ListArray.from_arrays(pa.array(key_offsets),
                                                pa.array([keys[i] for mb in microbatches for i in mb], pa.string())),
        "num_tokens": pa.array(np.array([p.num_tokens for p in packed], dtype=np.int32)),
    }
    return pa.table(columns, schema=load_schema(MICROBATCH))


class ConstructorServer(wire.ActionServer):
    def __init__(self, cfg: Config, index: int, planner: str, *, port: int = 0):
        self.cfg = cfg
        self.index = index
        self.mesh = Mesh.from_config(cfg.mesh, cfg.dp_per_constructor)
        if not 0 <= index < self.mesh.num_constructors:
            raise ValueError(f"constructor index {index} out of range (mesh has {self.mesh.num_constructors})")
        self.dp_ranks = self.mesh.dp_ranks_of(index)
        self._planner_location = planner
        self._clients = wire.ClientPool()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="fetch")
        self._cond = threading.Condition()
        self._staged: dict[tuple[int, int], pa.Table] = {}
        self._served: dict[int, dict[int, int]] = {dp: {} for dp in self.dp_ranks}  # dp -> rank -> last step
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
                tokens = self._fetch(step, view)
                tables = {int(dp): assemble(step, int(dp), mbs, view["keys"], tokens,
                                            self.cfg.global_batch.context_length, self.cfg.pad_token_id)
                          for dp, mbs in view["microbatches"].items()}
                with self._cond:
                    for dp, table in tables.items():
                        self._staged[(step, dp)] = table
                    self._assembled = step
                    self._cond.notify_all()
        except Exception as exc:
            log.exception("assembly failed")
            with self._cond:
                self._error = f"constructor {self.index}: assembly failed: {type(exc).__name__}: {exc}"
                self._cond.notify_all()

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
        dp = wire.field(request, "dp", int, "batch ticket")
        if dp not in self.dp_ranks:
            raise KeyError(f"data-parallel rank {dp} is not served by constructor {self.index} "
                           f"(it serves {list(self.dp_ranks)})")
        with self._cond:
            wire.wait_until(self._cond, lambda: self._error is not None or (step, dp) in self._staged
                            or step <= self._assembled, WAIT_SECONDS, f"step {step} of data-parallel rank {dp}")
            if self._error:
                raise RuntimeError(self._error)
            if (step, dp) not in self._staged:
                raise KeyError(f"step {step} of data-parallel rank {dp} was already served and released")
            table = self._staged[(step, dp)]
            self._release(dp, rank, step)
        return fl.RecordBatchStream(table)

    def _release(self, dp: int, rank: int, step: int) -> None:
        """Keep a step until every rank that reads this dp has moved two steps past it (retries)."""
        served = self._served[dp]
        served[rank] = max(step, served.get(rank, -1))
        done = min(served.values()) - 2
        for key in [k for k in self._staged if k[1] == dp and k[0] <= done]:
            del self._staged[key]

    def action_status(self, body):
        """Assembly progress and staged steps."""
        with self._cond:
            return {"index": self.index, "dp_ranks": list(self.dp_ranks), "assembled": self._assembled,
                    "staged": sorted([list(k) for k in self._staged]), "error": self._error}

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
