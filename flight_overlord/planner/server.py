"""Planner: the control path. Metadata in, plans and tickets out; no sample bytes.

A thin Flight adapter over :class:`~.planner.Planner` (the logic and its state):

- Loaders and constructors ``register`` (action) on start; planning begins once all have.
- A planning thread plans step after step, ``prefetch`` steps ahead of the slowest trainer;
  every plan is journaled, and any journaled step can be served again (to a restarted
  constructor, or after ``--resume``).
- Trainers call ``get_flight_info(FlightDescriptor.for_path("batch", step, rank))`` and get
  the serving constructor's location and a ticket signed with the run's secret.

Who may call what (``wire/security.py``): ``register``, ``plan``, ``resume_point`` need the cluster
secret; batch/encoder tickets and ``report`` are trainer calls; ``list_flights``, ``get_schema``,
source infos, ``status``, ``stats`` and ``list_actions`` are inspection calls.
"""
from __future__ import annotations

import argparse
import math
import logging
import threading

import numpy as np
import pyarrow.flight as fl

from .. import wire
from ..config import Config, load_config

from ..core.order import RowGroupRef
from ..core.positions import TrainerPositions
from ..serving import add_serving_args, advertised_host, start_metrics
from ..store import write_json_atomic
from ..wire.schemas import ENCODER_BATCH, HDP_MICROBATCH, MICROBATCH, SAMPLE_METADATA, load_schema
from ..wire.security import CLUSTER, INSPECT, TRAINER, Security, requires
from ..wire.server import ActionServer, ClientPool, call_any, connect, location_of, serve
from .planner import Planner, constructor_view
from .program import StepPlan
from .standby import await_takeover
from .strategy import load_strategy

log = logging.getLogger(__name__)
WAIT_SECONDS = 30.0  # a blocking call waits this long server-side, then the client may ask again
STEPS_AHEAD = 16    # beyond prefetch: how far past the planned steps a trainer may ask before it is an error


class PlannerServer(ActionServer):
    def __init__(self, cfg: Config, *, port: int | None = None, resume: bool = False, recover: bool = False,
                 security: Security | None = None):
        """``resume``: continue the run in ``run_dir`` from its journal; ``recover``: also take the
        registrations of the roles still running (a restart of the Planner alone). ``security``: the
        run's secrets (default: from the config and environment)."""
        self.cfg = cfg
        security = security or Security.from_config(cfg)
        self.mesh = cfg.trainer_mesh
        self.strategy = load_strategy(cfg, self.mesh)
        self._clients = ClientPool(security.credentials)
        self._cond = threading.Condition()
        self.planner = Planner(cfg, self.strategy, self._meta_fetcher)
        self.planner.open(resume=resume or recover)
        self._registry_file = cfg.run_dir / "planner" / "registry.json"
        self._resumed = resume or recover
        if recover and self._registry_file.exists():
            self.planner.registry.load_state_dict(wire.decode(self._registry_file.read_bytes(), str(self._registry_file)))
        layout = self.planner.journal_layout
        self._rewind_pending = layout is not None and layout != self.planner.layout()
        self._plans: dict[int, StepPlan] = {}      # planned, not yet fetched by every constructor
        self._fetched: dict[int, set[int]] = {}
        self._stats: dict[int, dict] = {}
        self._positions = TrainerPositions()       # where each rank is (asked, or reported by its constructor)
        self._requested = self._positions.requested  # rank -> the step it waits for
        self._planned = {"samples": {}, "tokens": {}}  # per source, by this process (metrics)
        self._reregistrations = {"loader": 0, "constructor": 0}  # restarts of registered roles (metrics)
        self._error: str | None = None
        self._stopping = False
        self._started = False
        super().__init__(cfg.network.host, cfg.network.planner_port if port is None else port, security)
        if self.planner.registry.complete():
            self._start_planning()

    # -- registration ------------------------------------------------------------------
    @requires(CLUSTER)
    def action_register(self, body):
        """A loader or constructor announces itself: {"role", "location", ...}. A registered role
        moves to another location only when its registered one no longer answers (recovery restarts a
        role on its own address), so not even a holder of the secret can redirect a live role."""
        role = wire.field(body, "role", str, "register")
        location = wire.field(body, "location", str, "register")
        scheme = self.security.scheme
        if not location.startswith(f"{scheme}://") or not location.rsplit(":", 1)[-1].isdigit():
            raise ValueError(f"register: location {location!r} must be {scheme}://HOST:PORT (the scheme of this run)")
        registry = self.planner.registry
        if role == "loader":
            source = self.cfg.source(wire.field(body, "source", str, "register")).name
            actor = wire.field(body, "actor", int, "register")
            replica = body.get("replica", 0)
            if isinstance(replica, bool) or not isinstance(replica, int):
                raise ValueError(f"malformed register: field 'replica' must be an integer, got {replica!r}")
            row_groups = wire.field(body, "row_groups", list, "register")
            name = f"loader {source}[{actor}] replica {replica}"
            with self._cond:
                current = registry.loaders.get((source, actor), {}).get(replica)
        elif role == "constructor":
            index = wire.field(body, "index", int, "register")
            name = f"constructor {index}"
            with self._cond:
                current = registry.constructors.get(index)
        else:
            raise ValueError(f"register: unknown role {role!r} (roles: loader, constructor)")
        if current is not None and current != location and self._answers(current):
            raise ValueError(f"register: {name} is registered at {current}, which still answers; a registered role "
                             f"moves only when its address no longer answers (restart it on the same address)")
        with self._cond:
            if role == "loader":
                registry.register_loader(source, actor, replica, location, row_groups)
            else:
                registry.register_constructor(index, location)
                if current is not None:  # its streams' positions died with it: wait for the trainers to say
                    self._positions.constructor_restarted(self._ranks_of(index))
            if current is not None:
                self._reregistrations[role] += 1
            if current is not None and current != location:
                log.warning("%s moved from %s (not answering) to %s", name, current, location)
            write_json_atomic(self._registry_file, registry.state_dict())
            if registry.complete():
                self._start_planning()
        return {"ok": True}

    def _ranks_of(self, constructor: int) -> list[int]:
        dps = set(self.mesh.dp_ranks_of(constructor))
        return [r for r in range(self.mesh.world_size) if self.mesh.coord(r).dp in dps]

    def _answers(self, location: str) -> bool:
        """Whether a role's registered address still answers (any reply, even an error, counts), on a
        fresh channel (a pooled one may be in reconnect back-off)."""
        try:
            client = connect(location, self.security.credentials)
        except Exception:  # noqa: BLE001 - an unusable address does not answer
            return False
        try:
            client.list_actions(options=fl.FlightCallOptions(timeout=3.0))
            return True
        except (fl.FlightUnavailableError, fl.FlightTimedOutError):
            return False
        except Exception:  # noqa: BLE001 - a server is there: it answered with an error
            return True
        finally:
            client.close()

    def _start_planning(self) -> None:
        if not self._started:
            self._started = True
            self.planner.start_feeds()
            threading.Thread(target=self._plan_loop, name="planning", daemon=True).start()

    # -- planning ----------------------------------------------------------------------
    def _plan_loop(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping or self._may_plan(self.planner.next_step))
                    if self._stopping:
                        return
                plan = self.planner.plan_next()
                if self.planner.scaled:
                    self._announce_reshard(self.planner.scaled)
                with self._cond:
                    self._plans[plan.step] = plan
                    self._fetched[plan.step] = set()
                    self._stats[plan.step] = plan.stats
                    for key in ("samples", "tokens"):
                        for source, n in plan.stats.get(key, {}).items():
                            self._planned[key][source] = self._planned[key].get(source, 0) + n
                    self._cond.notify_all()
        except Exception as exc:  # surface to every waiting client instead of hanging them
            log.exception("planning failed")
            with self._cond:
                self._error = f"planning failed: {type(exc).__name__}: {exc}"
                self._cond.notify_all()

    def _may_plan(self, step: int) -> bool:
        """Plan up to ``prefetch`` steps past the slowest trainer that has asked for data, once the
        feedback a dynamic schedule reads is complete (and, on a new layout, once trainers said
        where they resume)."""
        slowest = self._positions.slowest()
        return (not self._rewind_pending and step <= slowest + self.cfg.prefetch
                and self.planner.feedback_ready(step))

    def _announce_reshard(self, events: list[dict]) -> None:
        """Send a scaled source's new segments to every replica of its actors, in the background (a
        down loader learns them from its journal or its next metadata ticket)."""
        jobs = {(e["source"], loc): self.planner.scaling.segments[e["source"]] for e in events
                for (source, _), replicas in sorted(self.planner.registry.loaders.items()) if source == e["source"]
                for loc in replicas.values()}

        def send():
            for (source, location), segments in jobs.items():
                try:
                    wire.call(self._clients.get(location), "reshard", {"source": source, "segments": segments},
                              timeout=10)
                except Exception as exc:  # noqa: BLE001 - best effort: tickets carry the segments too
                    log.warning("reshard of %s at %s not delivered (%s); its tickets carry it", source, location, exc)
        threading.Thread(target=send, name="reshard", daemon=True).start()

    def _meta_fetcher(self, source: str):
        def fetch(epoch: int, rg: RowGroupRef) -> dict[str, np.ndarray]:
            actor = self.planner.registry.owner(source, rg.file, rg.row_group, epoch)
            request = {"kind": "metadata", "source": source, "actor": actor[1], "epoch": epoch, "file": rg.file,
                       "row_group": rg.row_group}
            segments = self.planner.scaling.segments_of(source) if self.planner.scaling is not None else None
            if segments:  # a resharded source: its actors learn (and journal) the ownership from the ticket
                request["segments"] = segments
            table = call_any(self._clients, self.planner.registry.locations(actor),
                             lambda c: c.do_get(wire.ticket(request)).read_all(),
                             what=f"loader {source}[{actor[1]}]", stop=lambda: self._stopping)
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

    def _check_horizon(self, step: int) -> None:
        """A step far past what is planned is a client's mistake (or abuse), answered at once rather
        than by holding a server thread until the client gives up."""
        horizon = max(self.planner.next_step, max(self._requested.values(), default=0)) + self.cfg.prefetch + STEPS_AHEAD
        if step > horizon and not self._rewind_pending:
            raise ValueError(f"step {step} is beyond the planning horizon: planned up to step "
                             f"{self.planner.next_step - 1}, trainers may ask at most {horizon}")

    def _wait_for_plan(self, step: int, timeout: float) -> None:
        wire.wait_until(self._cond, lambda: self._error is not None or self._stopping
                        or step < self.planner.next_step, timeout, f"the plan of step {step}")
        if self._error:
            raise RuntimeError(self._error)

    # -- trainer-facing ----------------------------------------------------------------
    def get_flight_info(self, context, descriptor):
        parts = [p.decode() if isinstance(p, bytes) else p for p in (descriptor.path or [])]
        batch = len(parts) == 3 and parts[0] in ("batch", "encoder")
        self.authorize(context, TRAINER if batch else INSPECT,
                       f"get_flight_info of {parts[0] if batch else 'this descriptor'!r}")
        if batch:
            step, rank = self._parse_batch(parts)
            self.authorize(context, TRAINER, f"get_flight_info of {parts[0]!r}", rank=rank)
            if parts[0] == "encoder" and self.strategy.image_graph is None:
                raise KeyError("no encoder streams: this run's strategy has no image graph "
                               "(images travel with their sequences in ('batch', STEP, RANK))")
            with self._cond:  # asking for a step is how a trainer tells us where it is
                self._trainer_at(step, lambda: self._positions.asked_step(rank, step))
                self._wait_for_plan(step, WAIT_SECONDS)
            return self._batch_info(descriptor, step, rank, parts[0])
        if parts and parts[0] == "rank":
            self.authorize(context, TRAINER, "get_flight_info of 'rank'")
            rank, first, end = self._parse_rank(parts)
            self.authorize(context, TRAINER, "get_flight_info of 'rank'", rank=rank)
            return self._rank_info(descriptor, rank, first, end)
        if len(parts) == 2 and parts[0] == "source":
            return self._source_info(descriptor, parts[1])
        raise KeyError(f"unknown descriptor {parts or descriptor.command!r}: this Planner serves "
                       f"('batch', STEP, RANK), ('encoder', STEP, RANK), ('rank', RANK[, FIRST_STEP]) and ('source', NAME)")

    def get_schema(self, context, descriptor):
        self.authorize(context, INSPECT, "get_schema")
        parts = [p.decode() if isinstance(p, bytes) else p for p in (descriptor.path or [])]
        if len(parts) == 3 and parts[0] in ("batch", "encoder"):
            self._parse_batch(parts)
            return fl.SchemaResult(load_schema(self._batch_schema() if parts[0] == "batch" else ENCODER_BATCH))
        if parts and parts[0] == "rank":
            self._parse_rank(parts)
            return fl.SchemaResult(load_schema(self._batch_schema()))
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

    def _parse_rank(self, parts) -> tuple[int, int | None, int | None]:
        """('rank', RANK[, FIRST_STEP[, END_STEP]]) -> (rank, first step or None, end or None)."""
        if len(parts) not in (2, 3, 4):
            raise ValueError(f"malformed descriptor {parts!r}: a rank stream is ('rank', RANK[, FIRST_STEP[, END_STEP]])")
        try:
            rank, first, end = [int(p) for p in parts[1:]] + [None] * (4 - len(parts))
        except ValueError:
            raise ValueError(f"malformed descriptor {parts!r}: rank, first and end step must be integers") from None
        if first is not None and (first < 0 or (end is not None and end <= first)):
            raise ValueError(f"malformed descriptor {parts!r}: first step must be >= 0 and before the end step")
        self.mesh.coord(rank)
        return rank, first, end

    def _rank_info(self, descriptor, rank: int, first: int | None, end: int | None) -> fl.FlightInfo:
        """One endpoint at the rank's constructor whose ticket streams the rank's steps from ``first`` on
        (default: where the rank is), up to ``end`` (default: no end). Asking is how a trainer says where
        it (re)starts: after that its constructor reports its position, and the Planner is off its
        per-step path."""
        with self._cond:
            first = self._requested.get(rank, 0) if first is None else first
            self._trainer_at(first, lambda: self._positions.asked_stream(rank, first))
            location = self.planner.registry.constructors[self.mesh.constructor_of(self.mesh.coord(rank).dp)]
        ticket = wire.ticket({**self.security.sign_ticket("rank", first, rank), **({"end": end} if end else {})})
        return fl.FlightInfo(load_schema(self._batch_schema()), descriptor, [fl.FlightEndpoint(ticket, [location])],
                             -1, -1)

    def _trainer_at(self, step: int, record) -> None:
        """A trainer said it waits for ``step`` (held lock): ``record()`` it; the first word of a trainer
        on a new layout says where re-planning starts."""
        self._check_horizon(step)
        record()
        if self._rewind_pending:
            self._rewind_pending = False
            self.planner.rewind(step)
        self._cond.notify_all()

    def _batch_info(self, descriptor, step: int, rank: int, kind: str = "batch") -> fl.FlightInfo:
        coord = self.mesh.coord(rank)
        location = self.planner.registry.constructors[self.mesh.constructor_of(coord.dp)]
        ticket = wire.ticket(self.security.sign_ticket(kind, step, rank))
        endpoint = fl.FlightEndpoint(ticket, [location])
        if kind == "encoder":
            return fl.FlightInfo(load_schema(ENCODER_BATCH), descriptor, [endpoint], -1, -1)
        return fl.FlightInfo(load_schema(self._batch_schema()), descriptor, [endpoint],
                             self.cfg.global_batch.microbatches, -1)

    def _batch_schema(self) -> str:
        """A rank's batch stream: microbatch rows, or under distribute('HDP') rows of per-sequence groups."""
        return HDP_MICROBATCH if self.strategy.axis == "HDP" else MICROBATCH

    def _source_info(self, descriptor, name: str) -> fl.FlightInfo:
        source = self.cfg.source(name)
        with self._cond:
            rows = sum(rg.num_rows for rg in self.planner.registry.source_row_groups(source.name))
            endpoints = [fl.FlightEndpoint(wire.ticket({"kind": "buffer", "source": actor[0], "actor": actor[1]}),
                                           self.planner.registry.locations(actor))
                         for actor in sorted(self.planner.registry.loaders) if actor[0] == source.name]
        return fl.FlightInfo(load_schema(SAMPLE_METADATA), descriptor, endpoints, rows, -1)

    def list_flights(self, context, criteria):
        self.authorize(context, INSPECT, "list_flights")
        with self._cond:
            upcoming = [s for s in sorted(self._stats) if s >= self.planner.next_step - self.cfg.prefetch - 1]
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
    @requires(CLUSTER)
    def action_plan(self, body):
        """A constructor's share of one step's plan: {"step", "constructor"}."""
        step = wire.field(body, "step", int, "plan")
        constructor = wire.field(body, "constructor", int, "plan")
        if not 0 <= constructor < self.mesh.num_constructors:
            raise ValueError(f"plan: constructor {constructor} out of range")
        positions = self._parsed_positions(body, constructor)
        with self._cond:
            self._advance(positions)
            self._check_horizon(step)
            self._wait_for_plan(step, WAIT_SECONDS)
            plan = self._plans.get(step)
            if plan is not None:
                self._fetched[step].add(constructor)
                if len(self._fetched[step]) == self.mesh.num_constructors:
                    del self._plans[step], self._fetched[step]
        if plan is None:  # fetched by everyone before, or planned by an earlier Planner process
            plan = self.planner.journaled(step)
            if plan is None:
                raise KeyError(f"plan of step {step} is in no journal of this run")
        return constructor_view(plan, constructor, self.mesh, self.planner.registry,
                                self.strategy.broadcast).to_wire()

    def _parsed_positions(self, body: dict, constructor: int) -> dict[int, int]:
        """A plan request's {"positions": {rank: step}}: the next step each of the constructor's rank
        streams sends (how the Planner paces itself without a per-step call from those trainers)."""
        raw = body.get("positions", {})
        if not isinstance(raw, dict):
            raise ValueError(f"malformed plan request: 'positions' must be an object, got {type(raw).__name__}")
        ranks = set(self._ranks_of(constructor))
        try:
            positions = {int(r): int(s) for r, s in raw.items()}
        except (TypeError, ValueError):
            raise ValueError("malformed plan request: 'positions' maps rank numbers to step numbers") from None
        if not set(positions) <= ranks:
            raise ValueError(f"plan: positions name ranks {sorted(set(positions) - ranks)} that constructor "
                             f"{constructor} does not serve")
        return positions

    def _advance(self, positions: dict[int, int]) -> None:
        """Stream positions a constructor reported (held lock): they only move forward."""
        if self._positions.reported(positions):
            self._cond.notify_all()

    @requires(CLUSTER)
    def action_resume_point(self, body):
        """Where a (re)started constructor begins: the earliest step its ranks are waiting for."""
        constructor = wire.field(body, "constructor", int, "resume_point")
        if not 0 <= constructor < self.mesh.num_constructors:
            raise ValueError(f"resume_point: constructor {constructor} out of range")
        ranks = self._ranks_of(constructor)
        with self._cond:
            wire.wait_until(self._cond, lambda: self._positions.settled(ranks), WAIT_SECONDS,
                            f"the stream ranks of constructor {constructor} to say where they resume")
            if not self._resumed and not all(r in self._requested for r in ranks):
                return {"step": min([self._requested.get(r, 0) for r in ranks])}
            wire.wait_until(self._cond, lambda: all(r in self._requested for r in ranks), WAIT_SECONDS,
                            f"the ranks of constructor {constructor} to say where they resume")
            return {"step": min(self._requested[r] for r in ranks)}

    # -- trainer feedback --------------------------------------------------------------
    @requires(TRAINER, rank_field="rank")
    def action_report(self, body):
        """A trainer's per-source loss for one step: {"step", "rank", "losses": {source: loss}}.
        One report per data-parallel group counts; it is journaled before any plan reads it."""
        step = wire.field(body, "step", int, "report")
        rank = wire.field(body, "rank", int, "report")
        losses = wire.field(body, "losses", dict, "report")
        self.mesh.coord(rank)
        for source, loss in losses.items():
            self.cfg.source(source)  # names the unknown source
            if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss):
                raise ValueError(f"report: loss of source {source!r} must be a finite number, got {loss!r}")
        if not 0 <= step < self.planner.next_step:
            raise ValueError(f"report: step {step} was not planned (planned: 0..{self.planner.next_step - 1})")
        with self._cond:
            if self.planner.report(step, rank, losses):
                self._cond.notify_all()
        return {"ok": True}

    # -- inspection --------------------------------------------------------------------
    @requires(INSPECT)
    def action_status(self, body):
        """Registration, planning progress, trainer positions, and where every role is."""
        with self._cond:
            registry = self.planner.registry
            return {"ready": registry.complete(), "planned": self.planner.next_step - 1,
                    "world_size": self.mesh.world_size,
                    "requested": {str(r): s for r, s in sorted(self._requested.items())},
                    "error": self._error, "recovered": self._resumed,
                    "samples_planned": dict(self._planned["samples"]), "tokens_planned": dict(self._planned["tokens"]),
                    "mixture_realized": _shares(self._planned["tokens" if self.cfg.global_batch.tokens_per_step
                                                              else "samples"]),
                    "reregistrations": dict(self._reregistrations), "metrics": getattr(self, "metrics_url", None),
                    **registry.state_dict(),
                    **({"scaling": self.planner.scaling.status()} if self.planner.scaling is not None else {})}

    @requires(INSPECT)
    def action_stats(self, body):
        """Per-step plan statistics (mixture, imbalance): {"from": step, "to": step}."""
        first = wire.field({"from": 0, **body}, "from", int, "stats")
        with self._cond:
            last = wire.field({"to": self.planner.next_step - 1, **body}, "to", int, "stats")
            return {str(s): stats for s, stats in self._stats.items() if first <= s <= last}  # never walks the range

    def shutdown(self):
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        super().shutdown()
        self._clients.close()
        self.planner.close()


def _shares(counts: dict[str, int]) -> dict[str, float]:
    """Each source's share of what was planned, in the unit the mixer weighs (tokens or samples)."""
    total = sum(counts.values())
    return {source: n / total for source, n in counts.items()} if total else {}


def main(argv=None) -> None:
    serve(*start(argv))


def start(argv=None) -> tuple[PlannerServer, str, str | None]:
    """The Planner up and serving (its threads run): (server, location, ready file). ``main`` then
    blocks on it; a Ray actor just keeps it."""
    parser = argparse.ArgumentParser(prog="overlord serve planner")
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, help="default: network.planner_port of the config (0: any free port)")
    parser.add_argument("--ready-file")
    parser.add_argument("--resume", action="store_true", help="continue the run in run_dir from its journal")
    parser.add_argument("--recover", action="store_true", help="restart of the Planner alone: --resume, and "
                        "keep the registrations of the roles still running")
    parser.add_argument("--standby-of", metavar="ADDRESS", help="a hot standby: wait until the Planner at "
                        "ADDRESS (grpc://HOST:PORT on this host) is gone, then serve on its port (--recover)")
    add_serving_args(parser)
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    host = advertised_host(cfg, args)
    if args.standby_of:
        await_takeover(args.standby_of, Security.from_config(cfg).credentials)
        args.port, args.recover = int(args.standby_of.rsplit(":", 1)[1]), True
    server = PlannerServer(cfg, port=args.port, resume=args.resume, recover=args.recover)
    location = location_of(server, host)
    start_metrics(server, cfg, args, "planner", location)
    return server, location, args.ready_file
