"""Planner: the control path. Metadata in, plans and tickets out; no sample bytes.

A thin Flight adapter (decode, authorize, call, encode) over the role's parts (``parts.PlannerParts``):
:class:`~.service.PlanService` (registration, the planning loop, trainer positions, constructors'
shares) around :class:`~.planner.Planner` (planning and its state), with its calls to other roles in
:class:`~.calls.PlannerCalls` and its FlightInfos in :class:`~.infos.FlightInfos`:

- Loaders and constructors ``register`` (action) on start; planning begins once all have.
- Trainers call ``get_flight_info`` of ``("rank", RANK[, FIRST[, END]])`` once (one long-lived stream;
  ``("encoder-rank", ...)`` for the images its vision encoder processes), or of ``("batch", STEP, RANK)``
  per step, for the serving constructor's location and a ticket signed with the run's secret.
- Constructors ask for their share of each step on one long-lived ``do_exchange`` each, their plans
  stream (``wire/plan_channel.py``); the ``plan`` action is one message of it as a call.

Who may call what (``wire/security.py``): ``register``, ``plan`` (and the plans stream), ``resume_point`` need
the cluster secret; batch/encoder tickets, ``report`` and ``position`` are trainer calls; ``list_flights``,
``get_schema``, source infos, ``status``, ``stats`` and ``list_actions`` are inspection calls.
"""
from __future__ import annotations

from dataclasses import replace

import pyarrow.flight as fl

from ..config import Config, load_config
from ..fence import Fence
from ..fence import claim as claim_fence
from ..role_process import advertised_host, role_parser, start_metrics
from ..wire import actions
from ..wire.plan_channel import PLANS_PER_ANSWER, action_answer, check_descriptor, serve_plans
from ..wire.schemas import SAMPLE_METADATA, load_schema
from ..wire.security import CLUSTER, INSPECT, TRAINER, Security, requires
from ..wire.server import ActionServer, location_of, serve
from ..wire.tickets import STREAM_KINDS, RankStream, Registration
from .audit import audit_run
from .edits import checked_weights
from .infos import DESCRIPTORS, FlightInfos, descriptor_parts
from .parts import PlannerParts
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
        self.parts = PlannerParts.build(cfg, self.strategy, security.credentials, resume=resume, recover=recover,
                                        guard=fence.enforce if fence is not None else None)
        self.planner, self.service = self.parts.planner, self.parts.service
        self.infos = FlightInfos(cfg, self.strategy, security)
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
        parts = descriptor_parts(descriptor)
        batch = len(parts) == 3 and parts[0] in ("batch", "encoder")
        self.authorize(context, TRAINER if batch else INSPECT,
                       f"get_flight_info of {parts[0] if batch else 'this descriptor'!r}")
        if batch:
            step, rank = self.infos.batch(parts)
            self.authorize(context, TRAINER, f"get_flight_info of {parts[0]!r}", rank=rank)
            self.infos.check_encoder(parts[0])
            location = self.service.trainer_asks(step, rank)
            return self.infos.batch_info(descriptor, step, rank, location, parts[0])
        if parts and parts[0] in STREAM_KINDS:
            self.authorize(context, TRAINER, f"get_flight_info of {parts[0]!r}")
            stream = RankStream.from_path(parts, self.mesh)
            self.authorize(context, TRAINER, f"get_flight_info of {parts[0]!r}", rank=stream.rank)
            self.infos.check_encoder(stream.kind)
            first, location = self.service.stream_asked(stream.rank, stream.first)
            return self.infos.rank_info(descriptor, stream, first, location)
        if len(parts) == 2 and parts[0] == "source":
            return self._source_info(descriptor, parts[1])
        raise KeyError(f"unknown descriptor {parts or descriptor.command!r}: this Planner serves {DESCRIPTORS}")

    def get_schema(self, context, descriptor):
        self.authorize(context, INSPECT, "get_schema")
        parts = descriptor_parts(descriptor)
        if len(parts) == 3 and parts[0] in ("batch", "encoder"):
            self.infos.batch(parts)
            return fl.SchemaResult(self.infos.schema(parts[0]))
        if parts and parts[0] in STREAM_KINDS:
            return fl.SchemaResult(self.infos.schema(RankStream.from_path(parts, self.mesh).kind))
        if len(parts) == 2 and parts[0] == "source":
            self.cfg.source(parts[1])
            return fl.SchemaResult(load_schema(SAMPLE_METADATA))
        raise KeyError(f"unknown descriptor {parts!r}: this Planner serves {DESCRIPTORS}")

    def _source_info(self, descriptor, name: str) -> fl.FlightInfo:
        rows, loaders = self.service.source_loaders(self.cfg.source(name).name)
        return self.infos.source_info(descriptor, load_schema(SAMPLE_METADATA), rows, loaders)

    def list_flights(self, context, criteria):
        """The upcoming planned steps of every rank, every rank's stream (from where it is; listing moves
        no position) and the sources."""
        self.authorize(context, INSPECT, "list_flights")
        kinds = 2 if self.strategy.image_graph is not None else 1  # the encoder's streams too, or not
        starts = self.service.stream_starts()
        for rank, first, location in starts:
            for kind in ("rank", "encoder-rank")[:kinds]:
                stream = RankStream(rank, kind=kind)
                yield self.infos.rank_info(fl.FlightDescriptor.for_path(*stream.descriptor_path()), stream, first,
                                           location)
        located = {rank: location for rank, _, location in starts}  # registered ones
        for step in self.service.upcoming_steps():
            for rank, location in located.items():
                for kind in ("batch", "encoder")[:kinds]:
                    yield self.infos.batch_info(fl.FlightDescriptor.for_path(kind, str(step), str(rank)), step, rank,
                                                location, kind)
        for source in self.cfg.sources:
            yield self._source_info(fl.FlightDescriptor.for_path("source", source.name), source.name)

    # -- constructor-facing ------------------------------------------------------------
    @requires(CLUSTER)
    def action_plan(self, body):
        """One message of a constructor's plans stream as a call: {"step", "constructor", "positions": {rank:
        step}, "wait": s} gets the step's constructor plan as one JSON object; {"constructor", "positions"},
        {"ok": true}."""
        return action_answer(self._plans_answer(body, 1))

    def do_exchange(self, context, descriptor, reader, writer):
        """A constructor's plans stream (``wire/plan_channel.py``)."""
        self.authorize(context, CLUSTER, "do_exchange")
        check_descriptor(descriptor)
        serve_plans(reader, writer, lambda body: self._plans_answer(body, PLANS_PER_ANSWER),
                    lambda: self.service.stopping)

    def _plans_answer(self, body: dict, steps: int):
        if self.fence is not None:  # the stream outlives the call's own check: each message is one
            self.fence.enforce()
        return self.service.answer(actions.plans_message(body), steps)

    @requires(CLUSTER)
    def action_resume_point(self, body):
        """Where a (re)started constructor begins: the earliest step its ranks are waiting for."""
        return {"step": self.service.resume_point(actions.ResumePointRequest.from_wire(body).constructor)}

    # -- trainer feedback --------------------------------------------------------------
    @requires(TRAINER, rank_field="rank")
    def action_position(self, body):
        """Where a rank that lost its state continues: {"rank"} -> {"rank", "step", "group"}: the ranks of
        its replica group continue together (``TrainerPositions.rejoin_step``, with what their constructor says
        it served). Records nothing: the rank
        says where it starts when it asks for its stream from there."""
        rank = actions.PositionRequest.from_wire(body).rank
        group = self.mesh.replica_group(rank)  # ValueError naming a rank outside the mesh
        served = self.parts.calls.served_steps(self.service.constructor_location(rank))
        step = self.service.rejoin_step(group, served)
        return {"rank": rank, "step": step, "group": list(group)}

    @requires(TRAINER, rank_field="rank")
    def action_report(self, body):
        """A trainer's feedback on one step: {"step", "rank", "losses": {source: loss}, "compute_seconds":
        seconds or [per microbatch], "encoder_seconds", "waits"} (losses and/or timings)."""
        report = actions.Report.from_wire(body)
        self.service.report(report.step, report.rank, report.losses, report.to_wire())
        return {"ok": True}

    # -- mixture -----------------------------------------------------------------------
    @requires(CLUSTER)
    def action_mix(self, body):
        """Live reweighting: {"weights": {source: w}, "step": first step (optional, default the first
        one not planned), "only": sources not named weigh 0 (default: they keep theirs), "dry_run"}.
        Journaled; a resume replays it. Answers the weights in force from that step on, and before it."""
        request = actions.MixRequest.from_wire(body)
        return self.planner.mix(checked_weights(request.weights, [s.name for s in self.cfg.sources]), request.step,
                                only=request.only, dry_run=request.dry_run)

    @requires(CLUSTER)
    def action_skip(self, body):
        """{"first", "last"}: the samples steps first..last would have had are dropped; from step first on
        the steps hold the samples after them (``core/skips.py``). Journaled; a resume replays it."""
        request = actions.SkipRequest.from_wire(body)
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
        request = actions.StatsRequest.from_wire(body)
        return self.service.step_stats(request.first, request.last)

    def shutdown(self):
        self.service.stop()
        self.parts.calls.stop()  # a metadata fetch in flight gives up
        super().shutdown()
        self.parts.close()


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
