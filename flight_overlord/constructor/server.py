"""Data Constructor: assembles the microbatches of its data-parallel ranks, step by step.

An assembly thread asks the Planner where its ranks are (``resume_point``: 0 on a fresh run, the
trainers' position after a restart), then for its share of each step's plan, fetches the samples
from every loader concurrently (riding out a loader's restart, or failing over to its shadow), packs each microbatch to the plan's capacity, and stages one
table per distinct delivery: a bucket's full sequences, each context-parallel rank's share of
them, or metadata only (ClientPlaceTree rules, ``core/mesh.py``). Trainers redeem
``{"kind": "batch", "step", "rank", "exp", "sig"}`` tickets (signed by the Planner, checked here)
with ``do_get``; the table streams from C++. Redeeming is a trainer call, ``status`` an inspection
call; the constructor's own calls to the Planner and loaders carry the cluster secret.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import logging
import threading

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl

from .. import wire
from ..wire.security import INSPECT, TRAINER, Security, requires
from ..wire.server import ActionServer, ClientPool, call_any, location_of, register, serve
from ..config import Config, load_config
from ..serving import add_serving_args, advertised_host, start_metrics
from ..core.mesh import Delivery
from ..wire.plan import ConstructorPlan, FetchGroup
from ..planner.strategy import load_strategy
from .hdp import hdp_rank_table
from .assembly import (Sample, build_microbatch, decode_or_error, drop_bad, encoder_table, rank_table,
                       shipped_images, truncate)
from .staging import Staging

log = logging.getLogger(__name__)
WAIT_SECONDS = 30.0


class ConstructorServer(ActionServer):
    def __init__(self, cfg: Config, index: int, planner: str, *, port: int = 0, security: Security | None = None):
        self.cfg = cfg
        security = security or Security.from_config(cfg)
        self.index = index
        self.mesh = cfg.trainer_mesh
        self.strategy = load_strategy(cfg, self.mesh)  # for its constructor_do_plan hook
        if not 0 <= index < self.mesh.num_constructors:
            raise ValueError(f"constructor index {index} out of range (mesh has {self.mesh.num_constructors})")
        self.dp_ranks = self.mesh.dp_ranks_of(index)
        self.ranks = [r for r in range(self.mesh.world_size) if self.mesh.coord(r).dp in self.dp_ranks]
        self._planner_location = planner
        self._clients = ClientPool(security.credentials)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="fetch")
        self._cond = threading.Condition()
        self._deliveries: dict[int, Delivery] = {}  # rank -> what it receives; known from the first plan
        self._encoder_axis: str | None = None  # the image graph's axis, if the plans have one
        # a reconnecting rank stream may ask again for steps lost in flight: keep prefetch more
        self._staging = Staging(streams=len(self.ranks), keep=2 + cfg.prefetch)
        self._positions: dict[int, int] = {}  # rank -> the next step its rank stream sends
        self._bytes_fetched = 0  # Arrow bytes received from loaders
        self._served: dict[int, dict] = {}  # rank -> {"step", "batches", "samples", "bytes"} (status, metrics)
        self._bad_samples: list[str] = []  # keys skipped for a bad image (vision.on_bad_image: skip)
        self._error: str | None = None
        self._stopping = False
        super().__init__(cfg.network.host, port, security)

    def start(self) -> None:
        threading.Thread(target=self._assemble_loop, name="assemble", daemon=True).start()

    # -- assembly ----------------------------------------------------------------------
    def _assemble_loop(self) -> None:
        try:
            start = self._call_planner("resume_point", {"constructor": self.index})
            if start is None:
                return
            with self._cond:
                self._staging.next_step = start["step"]
            log.info("constructor %d assembles from step %d", self.index, start["step"])
            while True:
                step = self._staging.next_step
                if not self._paced(step):
                    return
                raw = self._call_planner("plan", lambda: {"step": step, "constructor": self.index,
                                                          "positions": self._reported_positions()})
                if raw is None:
                    return
                plan = ConstructorPlan.from_wire(raw)
                tables = self._assemble(step, plan, self._fetch(step, plan))
                with self._cond:
                    self._staging.stage(step, tables)
                    self._cond.notify_all()
        except Exception as exc:
            log.exception("assembly failed")
            with self._cond:
                self._error = f"constructor {self.index}: assembly failed: {type(exc).__name__}: {exc}"
                self._cond.notify_all()

    def _paced(self, step: int) -> bool:
        """Ask for ``step``'s plan once every rank stream here is within ``prefetch`` steps of it, so the
        positions the request reports let the Planner plan it (no per-step call from those trainers).
        False once this server stops."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopping or not self._positions
                                or step <= min(self._positions.values()) + self.cfg.prefetch)
            return not self._stopping

    def _reported_positions(self) -> dict[str, int]:
        with self._cond:
            return {str(r): s for r, s in self._positions.items()}

    def _assemble(self, step: int, plan: ConstructorPlan, samples: dict[int, Sample]) -> dict:
        """Build each bucket's microbatches once, then cut one table per distinct delivery of its ranks."""
        if not self._deliveries:
            broadcast = frozenset(plan.broadcast)
            self._deliveries = {r: self.mesh.delivery(r, plan.axis, broadcast) for r in self.ranks}
            self._encoder_axis = plan.encoder_axis
            self._staging.streams = len(self.ranks) * (2 if plan.encoder_axis else 1)
        samples, bad = drop_bad(samples, self.cfg)
        self._bad_samples.extend(bad)
        image_token = self.cfg.vision.image_token_id if any(s.image_column for s in self.cfg.sources) else None
        tables = {}
        image_graph = plan.encoder is not None
        for bucket, bins in plan.microbatches.items():
            if plan.axis == "HDP":  # each sample a THD sequence of its own CP group (constructor/hdp.py)
                entries = [[(samples[i], size, first) for i, (size, first) in zip(mb, groups)]
                           for mb, groups in zip(bins, plan.extra["hdp"][str(bucket)])]
                for delivery in {d for d in self._deliveries.values() if d.bucket == bucket}:
                    tables[(step, delivery.key)] = hdp_rank_table(step, bucket, entries, delivery, self.cfg)
                continue
            microbatches = [build_microbatch([samples[i] for i in mb if i in samples], plan.capacity, self.cfg,
                                             image_token, self.strategy.seq_multiple) for mb in bins]
            microbatches = self._ordered(step, bucket, microbatches)
            for delivery in {d for d in self._deliveries.values() if d.bucket == bucket}:
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

    def _call_planner(self, action: str, body) -> dict | None:
        """A blocking Planner action: again while it times out (trainers have not moved on yet), and
        through a Planner restart; None once this server stops. ``body``: a dict, or a callable making
        it afresh for each try."""
        while not self._stopping:
            try:
                return call_any(self._clients, [self._planner_location],
                                lambda c: wire.call(c, action, body() if callable(body) else body),
                                what="planner", stop=lambda: self._stopping)
            except fl.FlightTimedOutError:
                continue
            except Exception:
                if self._stopping:
                    return None
                raise
        return None

    def _fetch(self, step: int, plan: ConstructorPlan) -> dict[int, Sample]:
        """Every loader's samples for this step, concurrently, through the decode stage; item index ->
        sample (or the failure of its decode), cut to its planned length (the plan may truncate a
        sample to the capacity)."""
        def one(groups: list[FetchGroup]) -> list[dict]:
            """The groups of the actors one loader process hosts (same locations): one call (a Flight call
            costs both sides CPU), their tables back to back."""
            parts = [{"source": g.source, "actor": g.actor, "samples": g.samples} for g in groups]
            request = wire.ticket({"kind": "samples", "step": step, "constructor": self.index,
                                   **(parts[0] if len(parts) == 1 else {"parts": parts})})
            table = call_any(self._clients, groups[0].locations, lambda c: c.do_get(request).read_all(),
                             what=f"the loader of {', '.join(sorted({g.source for g in groups}))}",
                             stop=lambda: self._stopping)
            if table.num_rows != sum(len(g.samples) for g in groups):
                raise RuntimeError(f"the loader at {groups[0].locations[0]} returned {table.num_rows} samples for "
                                   f"{sum(len(g.samples) for g in groups)} asked (step {step})")
            with self._cond:
                self._bytes_fetched += table.nbytes
            out, start = [], 0
            for group in groups:
                out.append(self._decoded(plan, group, table.slice(start, len(group.samples))))
                start += len(group.samples)
            return out

        by_location: dict[tuple[str, ...], list[FetchGroup]] = {}
        for group in plan.fetch:
            by_location.setdefault(tuple(group.locations), []).append(group)
        decoded = {id(g): part for groups, parts in zip(by_location.values(), self._pool.map(one, by_location.values()))
                   for g, part in zip(groups, parts)}
        samples: dict[int, Sample] = {}
        for group in plan.fetch:  # in plan order, as before the calls were merged
            samples.update(decoded[id(group)])
        return samples

    def _decoded(self, plan: ConstructorPlan, group: FetchGroup, table: pa.Table) -> dict:
        tokens = table.column("tokens").combine_chunks()
        offsets, values = tokens.offsets.to_numpy(), tokens.values.to_numpy()
        if not any(len(chunk.values) for chunk in table.column("images").chunks):  # text only: no decode stage
            return {item: truncate(Sample(plan.keys[item], values[offsets[j]:offsets[j + 1]]),
                                   plan.lengths[item], self.cfg)
                    for j, item in enumerate(group.items)}
        images, grids = table.column("images").to_pylist(), table.column("image_grids").to_pylist()
        ships = shipped_images(plan.encoder)  # image graph: decode only the images encoded here
        out = {}
        for j, item in enumerate(group.items):
            ids = values[offsets[j]:offsets[j + 1]]
            sample = decode_or_error(plan.keys[item], ids, images[j], grids[j], self.cfg,
                                     None if ships is None else ships.get(item, set()))
            out[item] = truncate(sample, plan.lengths[item], self.cfg) if isinstance(sample, Sample) else sample
        return out

    # -- Flight ------------------------------------------------------------------------
    def do_get(self, context, ticket):
        request = wire.decode(ticket.ticket, "ticket")
        kind = request.get("kind")
        if kind not in ("batch", "encoder", "rank"):
            raise ValueError(f"malformed ticket: kind {kind!r}, a constructor serves 'batch', 'encoder' and 'rank' "
                             f"tickets")
        self.authorize(context, TRAINER, f"do_get of a {kind!r} ticket")
        step = wire.field(request, "step", int, "batch ticket")
        rank = wire.field(request, "rank", int, "batch ticket")
        self.authorize(context, TRAINER, f"do_get of a {kind!r} ticket", rank=rank)
        if rank not in self.ranks:
            raise KeyError(f"rank {rank} is not served by constructor {self.index} "
                           f"(it serves the ranks of data-parallel groups {list(self.dp_ranks)})")
        self.security.verify_ticket(request)  # forged, altered or expired: FlightUnauthorizedError
        if kind == "rank":
            end = request.get("end")
            if end is not None and (isinstance(end, bool) or not isinstance(end, int) or end <= step):
                raise ValueError(f"malformed ticket: 'end' must be an integer after step {step}, got {end!r}")
            return self._rank_stream(rank, step, end)
        with self._cond:
            wire.wait_until(self._cond, lambda: self._error is not None or self._staging.assembled(step),
                            WAIT_SECONDS, f"step {step} of rank {rank}")
            if self._error:
                raise RuntimeError(self._error)
            if kind == "batch":
                key = (step, self._deliveries[rank].key)
            else:
                key = (step, ("encoder", self.mesh.bucket_of(rank, self._encoder_axis or "WORLD")))
            if key not in self._staging.tables:
                if kind == "encoder" and self._encoder_axis is None:
                    raise KeyError("no encoder stream: this run's plans have no image graph")
                raise KeyError(f"{kind} of step {step} for rank {rank} was already served and released")
            table = self._staging.tables[key]
            self._staging.served(kind, rank, step)
            if kind == "batch":
                self._count_served(rank, step, table)
        return fl.RecordBatchStream(table)

    def _rank_stream(self, rank: int, first: int, end: int | None) -> fl.GeneratorStream:
        """One long-lived stream of the rank's steps from ``first`` on: one record batch per step (its
        ``step`` column says which), flow-controlled by gRPC; it ends at ``end`` or when this server stops."""
        table = self._staged_batch(rank, first)  # the schema comes with the first step

        def steps():
            step, current = first, table
            while current is not None:
                yield current
                step += 1
                current = self._staged_batch(rank, step, stream=True) if end is None or step < end else None
        return fl.GeneratorStream(table.schema, steps())

    def _staged_batch(self, rank: int, step: int, stream: bool = False) -> pa.Table | None:
        """The rank's table of ``step`` as one record batch, once assembled, counted as served; None once
        this server stops (a stream then ends and its trainer asks the Planner again)."""
        with self._cond:
            self._positions[rank] = step
            self._cond.notify_all()
            if stream:  # a stream waits as long as it takes: its trainer is the slowest, or planning waits
                self._cond.wait_for(lambda: self._error is not None or self._stopping
                                    or self._staging.assembled(step))
            else:
                wire.wait_until(self._cond, lambda: self._error is not None or self._staging.assembled(step),
                                WAIT_SECONDS, f"step {step} of rank {rank}")
            if self._error:
                raise RuntimeError(self._error)
            if self._stopping:
                return None
            key = (step, self._deliveries[rank].key)
            if key not in self._staging.tables:
                raise KeyError(f"batch of step {step} for rank {rank} was already served and released")
            table = self._staging.tables[key]
            self._staging.served("batch", rank, step)
            self._count_served(rank, step, table)
        return table.combine_chunks()

    def _count_served(self, rank: int, step: int, table: pa.Table) -> None:
        served = self._served.setdefault(rank, {"step": -1, "batches": 0, "samples": 0, "bytes": 0})
        keys = table.column("sample_keys") if "sample_keys" in table.column_names else None
        served["step"] = max(served["step"], step)
        served["batches"] += 1
        served["samples"] += int(pc.sum(pc.list_value_length(keys)).as_py() or 0) if keys is not None else 0
        served["bytes"] += table.nbytes

    @requires(INSPECT)
    def action_status(self, body):
        """Assembly progress, staged steps, and what each rank was served."""
        with self._cond:
            return {"index": self.index, "dp_ranks": list(self.dp_ranks), "assembled": self._staging.next_step - 1,
                    "staged_steps": self._staging.steps(), "error": self._error,
                    "bad_samples": list(self._bad_samples), "bytes_fetched": self._bytes_fetched,
                    "served": {str(r): dict(s) for r, s in sorted(self._served.items())},
                    "metrics": getattr(self, "metrics_url", None)}

    def shutdown(self):
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        super().shutdown()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._clients.close()


def main(argv=None) -> None:
    serve(*start(argv))


def start(argv=None) -> tuple[ConstructorServer, str, str | None]:
    """A constructor up, registered and assembling: (server, location, ready file)."""
    parser = argparse.ArgumentParser(prog="overlord serve constructor")
    parser.add_argument("--config", required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--planner", required=True, help="grpc://host:port (or grpc+tls://) of the Planner")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file")
    add_serving_args(parser)
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    host = advertised_host(cfg, args)
    server = ConstructorServer(cfg, args.index, args.planner, port=args.port)
    location = location_of(server, host)
    start_metrics(server, cfg, args, "constructor", location)
    register(args.planner, {"role": "constructor", "index": args.index, "location": location},
             server.security.credentials)
    server.start()
    return server, location, args.ready_file
