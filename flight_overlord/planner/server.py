"""Planner: the control path. Metadata in, plans and tickets out; no sample bytes.

- Loaders and constructors ``register`` (action) on start; planning begins once all have.
- A planning thread plans step after step, ``prefetch`` steps ahead of the slowest active
  trainer, journals each plan, and keeps it until every constructor has fetched it.
- Trainers call ``get_flight_info(FlightDescriptor.for_path("batch", step, rank))`` and get
  the serving constructor's location and a ticket.
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import threading
from pathlib import Path

import numpy as np
import pyarrow.flight as fl

from .. import wire
from ..wire.server import ActionServer, ClientPool, location_of, serve
from ..config import Config, load_config
from ..core.mesh import Mesh
from ..core.mixing import Mixer
from ..core.order import RowGroupRef
from ..core.schedules import FeedbackLog, weights_at
from ..wire.schemas import ENCODER_BATCH, MICROBATCH, SAMPLE_METADATA, load_schema
from .feed import SourceFeed
from .program import StepPlan, plan_step
from .strategy import load_strategy

log = logging.getLogger(__name__)
WAIT_SECONDS = 30.0  # a blocking call waits this long server-side, then the client may ask again


class Journal:
    """Append-only JSON lines, one per planned step, flushed as written."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("w")

    def append(self, record: dict) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class PlannerServer(ActionServer):
    def __init__(self, cfg: Config, *, port: int | None = None):
        self.cfg = cfg
        self.mesh = Mesh.from_config(cfg.mesh, cfg.dp_per_constructor)
        self.strategy = load_strategy(cfg, self.mesh)
        self._feedback = FeedbackLog(expected=cfg.mesh.dp)  # one report per data-parallel group
        self._cond = threading.Condition()
        self._loaders: dict[tuple[str, int], str] = {}
        self._row_groups: dict[str, list[RowGroupRef]] = {s.name: [] for s in cfg.sources}
        self._constructors: dict[int, str] = {}
        self._owner: dict[tuple[str, str, int], str] = {}
        self._plans: dict[int, StepPlan] = {}
        self._fetched: dict[int, set[int]] = {}
        self._stats: dict[int, dict] = {}
        self._planned = -1
        self._requested: dict[int, int] = {}
        self._error: str | None = None
        self._stopping = False
        self._started = False
        self._clients = ClientPool()
        self._journal = Journal(cfg.run_dir / "plan-journal.jsonl")
        super().__init__(f"grpc://{cfg.host}:{cfg.planner_port if port is None else port}")

    # -- registration ------------------------------------------------------------------
    def action_register(self, body):
        """A loader or constructor announces itself: {"role", "location", ...}."""
        role = wire.field(body, "role", str, "register")
        location = wire.field(body, "location", str, "register")
        with self._cond:
            if role == "loader":
                self._register_loader(body, location)
            elif role == "constructor":
                index = wire.field(body, "index", int, "register")
                if not 0 <= index < self.mesh.num_constructors:
                    raise ValueError(f"register: constructor index {index} out of range "
                                     f"(this mesh has {self.mesh.num_constructors})")
                self._constructors[index] = location
            else:
                raise ValueError(f"register: unknown role {role!r} (roles: loader, constructor)")
            if self._all_registered() and not self._started:
                self._started = True
                threading.Thread(target=self._plan_loop, name="planning", daemon=True).start()
        return {"ok": True}

    def _register_loader(self, body: dict, location: str) -> None:
        source = self.cfg.source(wire.field(body, "source", str, "register"))
        actor = wire.field(body, "actor", int, "register")
        if not 0 <= actor < source.loaders:
            raise ValueError(f"register: actor {actor} out of range for source {source.name!r} "
                             f"({source.loaders} loaders)")
        if (source.name, actor) in self._loaders:
            return  # a retried registration
        rows = wire.field(body, "row_groups", list, "register")
        refs = [RowGroupRef(str(f), int(g), int(n)) for f, g, n in rows]
        self._loaders[(source.name, actor)] = location
        self._row_groups[source.name].extend(refs)
        for rg in refs:
            self._owner[(source.name, rg.file, rg.row_group)] = location

    def _all_registered(self) -> bool:
        expected = sum(s.loaders for s in self.cfg.sources)
        return len(self._loaders) == expected and len(self._constructors) == self.mesh.num_constructors

    # -- planning ----------------------------------------------------------------------
    def _plan_loop(self) -> None:
        try:
            feeds = {s.name: SourceFeed(s.name, self._row_groups[s.name], self.cfg.seed, self._meta_fetcher(s.name))
                     for s in self.cfg.sources}
            mixer = Mixer([s.name for s in self.cfg.sources])
            for step in itertools.count():
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping or (step <= self._horizon()
                                                                   and self._feedback_ready(step)))
                    if self._stopping:
                        return
                    weights, feedback = weights_at(self.strategy.schedule, step, self._feedback)
                plan = plan_step(step, feeds, mixer, self.strategy, self._checked_weights(step, weights), feedback)
                plan.stats["skipped"] = sum(f.skipped for f in feeds.values())
                self._journal.append(plan.to_record())
                with self._cond:
                    self._plans[step] = plan
                    self._fetched[step] = set()
                    self._stats[step] = plan.stats
                    self._planned = step
                    self._cond.notify_all()
        except Exception as exc:  # surface to every waiting client instead of hanging them
            log.exception("planning failed")
            with self._cond:
                self._error = f"planning failed: {type(exc).__name__}: {exc}"
                self._cond.notify_all()

    def _feedback_ready(self, step: int) -> bool:
        """A dynamic schedule plans step s only from the complete feedback of step s - lag."""
        lag = self.strategy.schedule.lag
        return not lag or step < lag or self._feedback.complete(step - lag)

    def _checked_weights(self, step: int, weights: dict) -> dict[str, float]:
        unknown = sorted(set(weights) - set(self.strategy.sources))
        if unknown:
            raise ValueError(f"the mixing schedule of step {step} names unknown source {unknown[0]!r} "
                             f"(sources: {', '.join(self.strategy.sources)})")
        if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError(f"the mixing schedule of step {step} gave weights {weights}: they must be "
                             f">= 0 with a positive sum")
        return {k: float(v) for k, v in weights.items()}

    def _horizon(self) -> int:
        """Plan up to ``prefetch`` steps past the slowest trainer that has asked for data."""
        slowest = min(self._requested.values()) if self._requested else -1
        return slowest + self.cfg.prefetch

    def _meta_fetcher(self, source: str):
        def fetch(epoch: int, rg: RowGroupRef) -> dict[str, np.ndarray]:
            location = self._owner[(source, rg.file, rg.row_group)]
            request = {"kind": "metadata", "epoch": epoch, "file": rg.file, "row_group": rg.row_group}
            table = self._clients.get(location).do_get(wire.ticket(request)).read_all()
            rows = table.column("row").to_numpy()
            meta = {}
            for name in ("num_tokens", "image_patches"):
                meta[name] = np.zeros(rg.num_rows, dtype=np.int64)
                meta[name][rows] = table.column(name).to_numpy()
            meta["image_sizes"] = [()] * rg.num_rows
            for row, sizes in zip(rows, table.column("image_sizes").to_pylist()):
                meta["image_sizes"][row] = tuple(sizes)
            return meta
        return fetch

    def _wait_for_plan(self, step: int, timeout: float) -> None:
        wire.wait_until(self._cond, lambda: self._error is not None or self._stopping or step <= self._planned,
                        timeout, f"the plan of step {step}")
        if self._error:
            raise RuntimeError(self._error)

    # -- trainer-facing ----------------------------------------------------------------
    def get_flight_info(self, context, descriptor):
        parts = [p.decode() if isinstance(p, bytes) else p for p in (descriptor.path or [])]
        if len(parts) == 3 and parts[0] in ("batch", "encoder"):
            step, rank = self._parse_batch(parts)
            if parts[0] == "encoder" and self.strategy.image_graph is None:
                raise KeyError("no encoder streams: this run's strategy has no image graph "
                               "(images travel with their sequences in ('batch', STEP, RANK))")
            with self._cond:  # asking for a step is how a trainer tells us where it is
                self._requested[rank] = max(step, self._requested.get(rank, -1))
                self._cond.notify_all()
                self._wait_for_plan(step, WAIT_SECONDS)
            return self._batch_info(descriptor, step, rank, parts[0])
        if len(parts) == 2 and parts[0] == "source":
            return self._source_info(descriptor, parts[1])
        raise KeyError(f"unknown descriptor {parts or descriptor.command!r}: this Planner serves "
                       f"('batch', STEP, RANK), ('encoder', STEP, RANK) and ('source', NAME)")

    def get_schema(self, context, descriptor):
        parts = [p.decode() if isinstance(p, bytes) else p for p in (descriptor.path or [])]
        if len(parts) == 3 and parts[0] in ("batch", "encoder"):
            self._parse_batch(parts)
            return fl.SchemaResult(load_schema(MICROBATCH if parts[0] == "batch" else ENCODER_BATCH))
        if len(parts) == 2 and parts[0] == "source":
            self.cfg.source(parts[1])
            return fl.SchemaResult(load_schema(SAMPLE_METADATA))
        raise KeyError(f"unknown descriptor {parts!r}: this Planner serves ('batch', STEP, RANK) and ('source', NAME)")

    def _parse_batch(self, parts) -> tuple[int, int]:
        try:
            step, rank = int(parts[1]), int(parts[2])
        except ValueError:
            raise ValueError(f"malformed descriptor {parts!r}: step and rank must be integers") from None
        if step < 0:
            raise ValueError(f"malformed descriptor {parts!r}: step must be >= 0")
        self.mesh.coord(rank)  # ValueError naming the rank if outside the mesh
        return step, rank

    def _batch_info(self, descriptor, step: int, rank: int, kind: str = "batch") -> fl.FlightInfo:
        coord = self.mesh.coord(rank)
        location = self._constructors[self.mesh.constructor_of(coord.dp)]
        ticket = wire.ticket({"kind": kind, "step": step, "rank": rank})
        endpoint = fl.FlightEndpoint(ticket, [location])
        if kind == "encoder":
            return fl.FlightInfo(load_schema(ENCODER_BATCH), descriptor, [endpoint], -1, -1)
        return fl.FlightInfo(load_schema(MICROBATCH), descriptor, [endpoint],
                             self.cfg.global_batch.microbatches, -1)

    def _source_info(self, descriptor, name: str) -> fl.FlightInfo:
        source = self.cfg.source(name)
        with self._cond:
            rows = sum(rg.num_rows for rg in self._row_groups[source.name])
            endpoints = [fl.FlightEndpoint(wire.ticket({"kind": "buffer"}), [location])
                         for (src, _), location in sorted(self._loaders.items()) if src == source.name]
        return fl.FlightInfo(load_schema(SAMPLE_METADATA), descriptor, endpoints, rows, -1)

    def list_flights(self, context, criteria):
        with self._cond:
            upcoming = [s for s in sorted(self._stats) if s > self._planned - self.cfg.prefetch - 1]
        for step in upcoming:
            for rank in range(self.mesh.world_size):
                descriptor = fl.FlightDescriptor.for_path("batch", str(step), str(rank))
                yield self._batch_info(descriptor, step, rank)
                if self.strategy.image_graph is not None:
                    descriptor = fl.FlightDescriptor.for_path("encoder", str(step), str(rank))
                    yield self._batch_info(descriptor, step, rank, "encoder")
        for source in self.cfg.sources:
            yield self._source_info(fl.FlightDescriptor.for_path("source", source.name), source.name)

    # -- constructor-facing ------------------------------------------------------------
    def action_plan(self, body):
        """A constructor's share of one step's plan: {"step", "constructor"}."""
        step = wire.field(body, "step", int, "plan")
        constructor = wire.field(body, "constructor", int, "plan")
        if not 0 <= constructor < self.mesh.num_constructors:
            raise ValueError(f"plan: constructor {constructor} out of range")
        with self._cond:
            self._wait_for_plan(step, float(body.get("timeout", WAIT_SECONDS)))
            if step not in self._plans:
                raise KeyError(f"plan of step {step} is no longer held (every constructor fetched it)")
            plan = self._plans[step]
            self._fetched[step].add(constructor)
            if len(self._fetched[step]) == self.mesh.num_constructors:
                del self._plans[step], self._fetched[step]
        return self._constructor_view(plan, constructor)

    def _constructor_view(self, plan: StepPlan, constructor: int) -> dict:
        """What one constructor assembles: its buckets' microbatches (and, with an image graph, the
        samples its ranks encode) as indices into ``keys``, the planned length of each sample, and
        which loader to fetch each sample from, with how many constructors fetch it in all."""
        consumers = self._consumers(plan)
        index: dict[str, int] = {}
        keys, lengths, fetch = [], [], {}

        def item(pick) -> int:
            ref = pick.ref
            if ref.key not in index:
                index[ref.key] = len(keys)
                location = self._owner[(ref.source, ref.file, ref.row_group)]
                entry = fetch.setdefault(location, {"location": location, "items": [], "samples": []})
                entry["items"].append(len(keys))
                entry["samples"].append([ref.epoch, ref.file, ref.row_group, ref.row, consumers[ref.key]])
                keys.append(ref.key)
                lengths.append(pick.tokens)
            return index[ref.key]

        microbatches = {str(b): [[item(p) for p in bin_] for bin_ in plan.bucket_bins(b)]
                        for b in self.mesh.buckets_of_constructor(constructor, plan.axis)}
        encoder = None
        if plan.encoder is not None:  # [item, image index, owner bucket, owner microbatch] per image a rank encodes
            owner = {p.ref.key: divmod(i, plan.microbatches) for i, bin_ in enumerate(plan.bins) for p in bin_}
            encoder = {str(b): [[item(p), image, *owner[p.ref.key]] for p, image in plan.encoder[b]]
                       for b in self.mesh.buckets_of_constructor(constructor, plan.encoder_axis)}
        return {"step": plan.step, "axis": plan.axis, "broadcast": sorted(self.strategy.broadcast),
                "capacity": plan.capacity, "keys": keys, "lengths": lengths, "microbatches": microbatches,
                "encoder_axis": plan.encoder_axis, "encoder": encoder, "fetch": list(fetch.values())}

    def _consumers(self, plan: StepPlan) -> dict[str, int]:
        """Per sample, how many constructors fetch it: 2 when an image graph sends its images to a
        rank of another constructor than its sequence's. The loader keeps it until both have."""
        if plan.consumers is None:
            needs: dict[str, set[int]] = {}
            for bucket in range(plan.num_buckets):
                c = self.mesh.constructor_of(self.mesh.dp_of_bucket(bucket, plan.axis))
                for bin_ in plan.bucket_bins(bucket):
                    for pick in bin_:
                        needs.setdefault(pick.ref.key, set()).add(c)
            for bucket, picks in enumerate(plan.encoder or []):
                c = self.mesh.constructor_of(self.mesh.dp_of_bucket(bucket, plan.encoder_axis))
                for pick, _ in picks:
                    needs.setdefault(pick.ref.key, set()).add(c)
            plan.consumers = {k: len(v) for k, v in needs.items()}
        return plan.consumers

    # -- trainer feedback --------------------------------------------------------------
    def action_report(self, body):
        """A trainer's per-source loss for one step: {"step", "rank", "losses": {source: loss}}.
        One report per data-parallel group counts; it is journaled before any plan reads it."""
        step = wire.field(body, "step", int, "report")
        rank = wire.field(body, "rank", int, "report")
        losses = wire.field(body, "losses", dict, "report")
        group = self.mesh.coord(rank).dp
        for source, loss in losses.items():
            self.cfg.source(source)  # names the unknown source
            if isinstance(loss, bool) or not isinstance(loss, (int, float)) or loss != loss:
                raise ValueError(f"report: loss of source {source!r} must be a number, got {loss!r}")
        with self._cond:
            if self._feedback.add(step, group, losses):
                self._journal.append({"report": {"step": step, "group": group, "rank": rank, "losses": losses}})
                self._cond.notify_all()
        return {"ok": True}

    # -- inspection --------------------------------------------------------------------
    def action_status(self, body):
        """Registration, planning progress and trainer positions."""
        with self._cond:
            return {"ready": self._all_registered(), "loaders": len(self._loaders),
                    "constructors": len(self._constructors), "planned": self._planned,
                    "requested": {str(r): s for r, s in sorted(self._requested.items())},
                    "error": self._error}

    def action_stats(self, body):
        """Per-step plan statistics (mixture, imbalance): {"from": step, "to": step}."""
        first = int(body.get("from", 0))
        with self._cond:
            last = int(body.get("to", self._planned))
            return {str(s): self._stats[s] for s in range(first, last + 1) if s in self._stats}

    def shutdown(self):
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        super().shutdown()
        self._clients.close()
        self._journal.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="overlord serve planner")
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, help="default: network.planner_port of the config (0: any free port)")
    parser.add_argument("--ready-file")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    server = PlannerServer(cfg, port=args.port)
    serve(server, location_of(server, cfg.host), args.ready_file)
