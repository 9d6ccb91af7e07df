"""Planner: the control path. Metadata in, plans and tickets out; no sample bytes.

A thin Flight adapter (decode, authorize, call, encode) over :class:`~.service.PlanService` (registration,
hand-out, trainer positions) and :class:`~.planner.Planner` (planning and its state); its calls to
other roles are in :class:`~.calls.PlannerCalls`:

- Loaders and constructors ``register`` (action) on start; planning begins once all have.
- A planning thread plans step after step, ``prefetch`` steps ahead of the slowest trainer;
  every plan is journaled, and any journaled step can be served again (to a restarted
  constructor, or after ``--resume``).
- Trainers call ``get_flight_info`` of ``("batch", STEP, RANK)`` (or once of ``("rank", RANK[, FIRST[, END]])``,
  one long-lived stream; ``("encoder-rank", ...)`` for the images its vision encoder processes) for the
  serving constructor's location and a ticket signed with the run's secret.

- Constructors ask for their share of each step on one long-lived ``do_exchange`` each, their plans
  stream (``wire/plan_channel.py``: the ``plan`` action's body and answer as one message each).

Who may call what (``wire/security.py``): ``register``, ``plan`` (and the plans stream), ``resume_point`` need the cluster
secret; batch/encoder tickets, ``report`` and ``position`` are trainer calls; ``list_flights``, ``get_schema``,
source infos, ``status``, ``stats`` and ``list_actions`` are inspection calls.
"""
from __future__ import annotations

from dataclasses import replace
import pyarrow.flight as fl

from .. import wire
from ..config import Config, load_config
from ..fence import Fence, claim as claim_fence
from ..role_process import advertised_host, role_parser, start_metrics
from ..wire.schemas import ENCODER_BATCH, HDP_MICROBATCH, MICROBATCH, SAMPLE_METADATA, load_schema
from ..wire.actions import (MixRequest, PlanRequest, PositionRequest, Report, ResumePointRequest, SkipRequest,
                            StatsRequest)
from ..wire.plan import PlanView
from ..wire.plan_channel import OK, VIEWS_PER_ANSWER, check_descriptor, serve_plans
from ..wire.security import CLUSTER, INSPECT, TRAINER, Security, requires
from ..wire.server import ActionServer, location_of, serve
from ..wire.tickets import STREAM_KINDS, BatchTicket, BufferTicket, RankStream, Registration
from .audit import audit_run, mark_run_start
from .calls import PlannerCalls
from .edits import checked_weights
from .planner import Planner
from .service import PlanService
from .standby import add_standby_arg, take_over_if_standby
from .strategy import load_strategy


class PlannerServer(ActionServer):
    def __init__(self, cfg: Config, *, port: int | None = None, resume: bool = False, recover: bool = False,
                 security: Security | None = None, fence: Fence | None = None):
        """``resume``: continue the run in ``run_dir`` from its journal; ``recover``: also take the
        registrations of the roles still running (a restart of the Planner alone). ``security``: the
        run's secrets (default: from the config and environment). ``fence``: this process's claim on the
        Planner's role, checked on every call and before every journal record."""
        self.cfg = cfg
        self.fence = fence
        security = security or Security.from_config(cfg)
        self.mesh = cfg.mesh
        self.strategy = load_strategy(cfg, self.mesh)
        self.calls = PlannerCalls(security.credentials, stopping=lambda: self.service.stopping,
                                  fetch_seconds=cfg.liveness.fetch_seconds)
        self.planner = self.calls.planner = Planner(cfg, self.strategy, self.calls.meta_fetcher)
        self.planner.open(resume=resume or recover, guard=fence.enforce if fence is not None else None)
        if not recover:  # a new segment of the run (overlord audit tells what a resume rolled back)
            mark_run_start(cfg, self.planner.mixture, resume=resume)
        self.service = PlanService(cfg, self.planner, resumed=resume, recover=recover, answers=self.calls.answers,
                                   on_scaled=self.calls.announce_reshard)
        super().__init__(cfg.network.host, cfg.network.planner_port if port is None else port, security)
        self.service.start_if_complete()

    # -- registration ------------------------------------------------------------------
    @requires(CLUSTER)
    def action_register(self, body):
        """A loader or constructor announces itself: {"role", "location", ...} (``PlanService.register``)."""
        registration = Registration.from_wire(body)
        location, scheme = registration.location, self.security.scheme
        if not location.startswith(f"{scheme}://") or not location.rsplit(":", 1)[-1].isdigit():
            raise ValueError(f"register: location {location!r} must be {scheme}://HOST:PORT (the scheme of this run)")
        if registration.role == "loader":
            self.service.register_loader(registration.source, registration.actor, registration.replica, location,
                                         registration.catalog if registration.catalog is not None
                                         else registration.row_groups)
        else:
            self.service.register_constructor(registration.index, location)
        return {"ok": True}

    # -- trainer-facing ----------------------------------------------------------------
    def get_flight_info(self, context, descriptor):
        parts = [p.decode() if isinstance(p, bytes) else p for p in (descriptor.path or [])]
        batch = len(parts) == 3 and parts[0] in ("batch", "encoder")
        self.authorize(context, TRAINER if batch else INSPECT,
                       f"get_flight_info of {parts[0] if batch else 'this descriptor'!r}")
        if batch:
            step, rank = self._parse_batch(parts)
            self.authorize(context, TRAINER, f"get_flight_info of {parts[0]!r}", rank=rank)
            self._check_encoder(parts[0])
            self.service.trainer_asks(step, rank)
            with self.service.cond:
                location = self.service.constructor_of(rank)
            return self._batch_info(descriptor, step, rank, location, parts[0])
        if parts and parts[0] in STREAM_KINDS:
            self.authorize(context, TRAINER, f"get_flight_info of {parts[0]!r}")
            stream = RankStream.from_path(parts, self.mesh)
            self.authorize(context, TRAINER, f"get_flight_info of {parts[0]!r}", rank=stream.rank)
            self._check_encoder(stream.kind)
            first, location = self.service.stream_asked(stream.rank, stream.first)
            return self._rank_info(descriptor, stream, first, location)
        if len(parts) == 2 and parts[0] == "source":
            return self._source_info(descriptor, parts[1])
        raise KeyError(f"unknown descriptor {parts or descriptor.command!r}: this Planner serves ('batch', STEP, "
                       f"RANK), ('encoder', STEP, RANK), ('rank', RANK[, FIRST[, END]]), ('encoder-rank', RANK[, "
                       f"FIRST[, END]]) and ('source', NAME)")

    def _check_encoder(self, kind: str) -> None:
        if kind in ("encoder", "encoder-rank") and self.strategy.image_graph is None:
            raise KeyError(f"no encoder streams ({kind!r}): this run's strategy has no image graph "
                           f"(images travel with their sequences in ('batch', STEP, RANK) and ('rank', RANK))")

    def get_schema(self, context, descriptor):
        self.authorize(context, INSPECT, "get_schema")
        parts = [p.decode() if isinstance(p, bytes) else p for p in (descriptor.path or [])]
        if len(parts) == 3 and parts[0] in ("batch", "encoder"):
            self._parse_batch(parts)
            return fl.SchemaResult(load_schema(self._batch_schema() if parts[0] == "batch" else ENCODER_BATCH))
        if parts and parts[0] in STREAM_KINDS:
            stream = RankStream.from_path(parts, self.mesh)
            return fl.SchemaResult(load_schema(self._batch_schema() if stream.kind == "rank" else ENCODER_BATCH))
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

    def _rank_info(self, descriptor, stream: RankStream, first: int, location: str) -> fl.FlightInfo:
        """One endpoint at the rank's constructor (``location``) whose ticket streams the rank's steps
        (or its encoder inputs) from ``first`` on."""
        signed = self.security.sign_ticket(stream.kind, first, stream.rank)
        ticket = BatchTicket(stream.kind, first, stream.rank, signed, stream.end)
        endpoint = fl.FlightEndpoint(wire.ticket(ticket.to_wire()), [location])
        schema = self._batch_schema() if stream.kind == "rank" else ENCODER_BATCH
        return fl.FlightInfo(load_schema(schema), descriptor, [endpoint], -1, -1)

    def _batch_info(self, descriptor, step: int, rank: int, location: str, kind: str = "batch") -> fl.FlightInfo:
        endpoint = fl.FlightEndpoint(wire.ticket(self.security.sign_ticket(kind, step, rank)), [location])
        if kind == "encoder":
            return fl.FlightInfo(load_schema(ENCODER_BATCH), descriptor, [endpoint], -1, -1)
        return fl.FlightInfo(load_schema(self._batch_schema()), descriptor, [endpoint],
                             self.cfg.global_batch.microbatches, -1)

    def _batch_schema(self) -> str:
        """A rank's batch stream: microbatch rows, or under distribute('HDP') rows of per-sequence groups."""
        return HDP_MICROBATCH if self.strategy.axis == "HDP" else MICROBATCH

    def _source_info(self, descriptor, name: str) -> fl.FlightInfo:
        source = self.cfg.source(name)
        with self.service.cond:
            rows = sum(rg.num_rows for rg in self.planner.registry.source_row_groups(source.name))
            endpoints = [fl.FlightEndpoint(wire.ticket(BufferTicket(*actor).to_wire()),
                                           self.planner.registry.locations(actor))
                         for actor in sorted(self.planner.registry.loaders) if actor[0] == source.name]
        return fl.FlightInfo(load_schema(SAMPLE_METADATA), descriptor, endpoints, rows, -1)

    def list_flights(self, context, criteria):
        """The upcoming planned steps of every rank, every rank's stream (from where it is; listing moves
        no position) and the sources."""
        self.authorize(context, INSPECT, "list_flights")
        kinds = 2 if self.strategy.image_graph is not None else 1  # the encoder's streams too, or not
        for rank, first, location in self.service.stream_starts():
            for kind in ("rank", "encoder-rank")[:kinds]:
                stream = RankStream(rank, kind=kind)
                yield self._rank_info(fl.FlightDescriptor.for_path(*stream.descriptor_path()), stream, first, location)
        located = {rank: location for rank, _, location in self.service.stream_starts()}  # registered ones
        for step in self.service.upcoming_steps():
            for rank, location in located.items():
                for kind in ("batch", "encoder")[:kinds]:
                    yield self._batch_info(fl.FlightDescriptor.for_path(kind, str(step), str(rank)), step, rank,
                                           location, kind)
        for source in self.cfg.sources:
            yield self._source_info(fl.FlightDescriptor.for_path("source", source.name), source.name)

    # -- constructor-facing ------------------------------------------------------------
    @requires(CLUSTER)
    def action_plan(self, body):
        """A constructor's share of one step's plan: {"step", "constructor", "positions": {rank: step}, "wait": s};
        one JSON object (constructors get it on their plans stream, as a record batch and a header)."""
        return self._views(body)[0].to_wire()

    def _views(self, body: dict, views: int = 1) -> list[PlanView]:
        request = PlanRequest.from_wire(body)
        return self.service.constructor_plan(request.step, request.constructor, request.positions, request.wait,
                                             views)

    def do_exchange(self, context, descriptor, reader, writer):
        """A constructor's plans stream (``wire/plan_channel.py``): ``action_plan`` as one message each."""
        self.authorize(context, CLUSTER, "do_exchange")
        check_descriptor(descriptor)
        serve_plans(reader, writer, self._plans_answer, lambda: self.service.stopping)

    def _plans_answer(self, body: dict) -> bytes | list[PlanView]:
        if self.fence is not None:  # the stream outlives the call's own check: each message is one
            self.fence.enforce()
        if "step" in body:
            return self._views(body, VIEWS_PER_ANSWER)
        self.service.constructor_positions(wire.field(body, "constructor", int, "positions report"), body.get("positions"))
        return OK

    @requires(CLUSTER)
    def action_resume_point(self, body):
        """Where a (re)started constructor begins: the earliest step its ranks are waiting for."""
        return {"step": self.service.resume_point(ResumePointRequest.from_wire(body).constructor)}

    # -- trainer feedback --------------------------------------------------------------
    @requires(TRAINER, rank_field="rank")
    def action_position(self, body):
        """Where a rank that lost its state continues: {"rank"} -> {"rank", "step", "group"}: the ranks of
        its replica group continue together (``TrainerPositions.rejoin_step``, with what their constructor says
        it served). Records nothing: the rank
        says where it starts when it asks for its stream from there."""
        rank = PositionRequest.from_wire(body).rank
        group = self.mesh.replica_group(rank)  # ValueError naming a rank outside the mesh
        with self.service.cond:
            location = self.service.constructor_of(rank)
        served = self.calls.served_steps(location)
        with self.service.cond:
            step = self.service.positions.rejoin_step(group, served)
        return {"rank": rank, "step": step, "group": list(group)}

    @requires(TRAINER, rank_field="rank")
    def action_report(self, body):
        """A trainer's feedback on one step: {"step", "rank", "losses": {source: loss}, "compute_seconds":
        seconds or [per microbatch], "encoder_seconds", "waits"} (losses and/or timings)."""
        report = Report.from_wire(body)
        self.service.report(report.step, report.rank, report.losses, report.to_wire())
        return {"ok": True}

    # -- mixture -----------------------------------------------------------------------
    @requires(CLUSTER)
    def action_mix(self, body):
        """Live reweighting: {"weights": {source: w}, "step": first step (optional, default the first
        one not planned), "only": sources not named weigh 0 (default: they keep theirs), "dry_run"}.
        Journaled; a resume replays it. Answers the weights in force from that step on, and before it."""
        request = MixRequest.from_wire(body)
        return self.planner.mix(checked_weights(request.weights, [s.name for s in self.cfg.sources]), request.step,
                                only=request.only, dry_run=request.dry_run)

    @requires(CLUSTER)
    def action_skip(self, body):
        """{"first", "last"}: the samples steps first..last would have had are dropped; from step first on
        the steps hold the samples after them (``core/skips.py``). Journaled; a resume replays it."""
        request = SkipRequest.from_wire(body)
        return self.planner.skip(request.first, request.last)

    @requires(INSPECT)
    def action_audit(self, body):
        """What this run delivered, from its journals (``overlord audit``)."""
        return audit_run(self.cfg.run_dir, self.planner)

    # -- inspection --------------------------------------------------------------------
    @requires(INSPECT)
    def action_status(self, body):
        """Registration, planning progress, trainer positions, and where every role is."""
        return replace(self.service.status(), metrics=getattr(self, "metrics_url", None)).to_wire()

    @requires(INSPECT)
    def action_stats(self, body):
        """Per-step plan statistics (mixture, imbalance): {"from": step, "to": step}."""
        request = StatsRequest.from_wire(body)
        return self.service.step_stats(request.first, request.last)

    def shutdown(self):
        self.service.stop()
        super().shutdown()
        self.calls.close()
        self.planner.close()


def main(argv=None) -> None:
    serve(*start(argv))


def start(argv=None) -> tuple[PlannerServer, str, str | None]:
    """The Planner up and serving (its threads run): (server, location, ready file). ``main`` then
    blocks on it; a Ray actor just keeps it."""
    parser = role_parser("planner", planner=False)
    parser.add_argument("--resume", action="store_true", help="continue the run in run_dir from its journal")
    parser.add_argument("--recover", action="store_true", help="restart of the Planner alone: --resume, and "
                        "keep the registrations of the roles still running")
    add_standby_arg(parser)
    args = parser.parse_args(argv)
    cfg = load_config(args.config, expand_files=False)  # it finds the sources' row groups by catalog digest
    host = advertised_host(cfg, args)
    take_over_if_standby(args, Security.from_config(cfg).credentials, cfg)
    server = PlannerServer(cfg, port=args.port, resume=args.resume, recover=args.recover,
                           fence=claim_fence(cfg.run_dir, "planner"))
    location = location_of(server, host)
    start_metrics(server, cfg, args, "planner", location)
    return server, location, args.ready_file
