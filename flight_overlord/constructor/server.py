"""Data Constructor: assembles the microbatches of its data-parallel ranks, step by step.

An assembly thread asks the Planner where its ranks are (``resume_point``: 0 on a fresh run, the
trainers' position after a restart), then for its share of each step's plan (on its plans stream,
``wire/plan_channel.py``), fetches the samples
from every loader concurrently (riding out a loader's restart, or failing over to its shadow), packs each microbatch to the plan's capacity, and stages one
table per distinct delivery: a bucket's full sequences, each context-parallel rank's share of
them, or metadata only (ClientPlaceTree rules, ``core/mesh.py``). Trainers redeem
``{"kind": "batch", "step", "rank", "exp", "sig"}`` tickets (signed by the Planner, checked here)
with ``do_get``; the table streams from C++. A ``"rank"`` ticket (``"end"`` optional) streams the
rank's steps from ``step`` on, one record batch each, on one long-lived ``do_get``; an ``"encoder-rank"``
ticket likewise streams the images its vision encoder processes (image graph). Redeeming is a trainer call, ``status`` an inspection
call; the constructor's own calls to the Planner and loaders carry the cluster secret.
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
from dataclasses import replace

import pyarrow.flight as fl

from .. import wire
from ..config import Config, load_config
from ..core.starvation import fetch_shares
from ..fence import claim as claim_fence
from ..planner.strategy import load_strategy
from ..role_process import advertised_host, role_parser, start_metrics
from ..wire.actions import PlanRequest, ResumePointRequest
from ..wire.plan import ConstructorPlan, FetchGroup
from ..wire.credits import CreditReader
from ..wire.plan_channel import POSITIONS_SECONDS, PlanChannel
from ..wire.security import INSPECT, TRAINER, Security, requires
from ..wire.server import ActionServer, ClientPool, ask_again, call_any, location_of, register, serve, within
from ..wire.tickets import STREAM_KINDS, BatchTicket, Registration, SamplesPart, SamplesTicket
from .assembly import Sample
from .deliveries import DeliveryJournal
from .loader_addresses import LoaderAddresses
from .constructor import Constructor

log = logging.getLogger(__name__)


class ConstructorServer(ActionServer):
    """The Flight adapter of a :class:`~.constructor.Constructor`: an assembly thread that asks the
    Planner for plans and the loaders for samples, and ``do_get`` of a rank's staged table."""

    def __init__(self, cfg: Config, index: int, planner: str, *, port: int = 0, security: Security | None = None):
        self.cfg = cfg
        security = security or Security.from_config(cfg)
        self.index = index
        self._delivered = DeliveryJournal(cfg.run_dir, index)  # what was served, for `overlord audit`
        self.constructor = Constructor(cfg, index, load_strategy(cfg, cfg.mesh), self._delivered.served,
                                       rebuild=self._assemble_again, on_rewind=self._delivered.rewound)
        self.mesh = self.constructor.mesh
        self.ranks = self.constructor.ranks
        self._planner_location = planner
        self._clients = ClientPool(security.credentials)
        self._loaders = LoaderAddresses(self._clients, planner)  # a loader that moved: where it is now
        self._plans = PlanChannel()  # plan requests as messages on one stream, not one call each
        self._ahead: dict[int, ConstructorPlan] = {}  # views of later steps that came with an answer (assembly thread)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="fetch")
        super().__init__(cfg.network.host, port, security)

    def start(self) -> None:
        threading.Thread(target=self._assemble_loop, name="assemble", daemon=True).start()

    # -- assembly ----------------------------------------------------------------------
    def _assemble_loop(self) -> None:
        constructor = self.constructor
        try:
            start = self._call_planner("resume_point", ResumePointRequest(self.index).to_wire())
            if start is None:
                return
            constructor.begin_at(start["step"])
            log.info("constructor %d assembles from step %d", self.index, start["step"])
            while True:
                self._check_fence()  # a replaced constructor asks for no more plans or samples
                step = constructor.staging.next_step
                if not self._paced(step):
                    return
                asked = time.monotonic()
                plan = self._plan_of(step)
                if plan is None:
                    return
                planned = time.monotonic()
                samples, critical = self._fetch(step, plan)
                fetched = time.monotonic()
                tables = constructor.assemble(step, plan, samples)
                constructor.stage(step, tables, [(asked, planned, "plan", None), (planned, fetched, None, critical),
                                                 (fetched, time.monotonic(), "assembly", None)])
        except Exception as exc:
            log.exception("assembly failed")
            constructor.fail(exc)

    def _assemble_again(self, step: int) -> dict:
        """A released step's tables built again, for a rank that went back to it: its plan as the Planner
        serves it again (from its journal), its samples from the loaders (a released row group is read
        again), the same assembly: the same tables as the first time."""
        raw = self._call_planner("plan", PlanRequest(step, self.index).to_wire())
        if raw is None:
            raise RuntimeError(f"constructor {self.index} is stopping: ask the Planner for the stream again")
        plan = ConstructorPlan.from_wire(raw)
        samples, _ = self._fetch(step, plan)
        log.info("constructor %d: step %d assembled again for a rank that went back to it", self.index, step)
        return self.constructor.assemble(step, plan, samples)

    def _plan_of(self, step: int) -> ConstructorPlan | None:
        """This constructor's view of ``step``: taken ahead with an earlier step's answer (a plan's samples
        never change once made; a loader that moved meanwhile is looked up again by the fetch, as for any
        view), or asked for, together with the next steps' views already planned; None once this server stops."""
        self._ahead = {s: p for s, p in self._ahead.items() if s >= step}  # none behind is asked for again
        if step in self._ahead:
            return self._ahead.pop(step)
        views = self._ask_plans(lambda: PlanRequest(step, self.index, self.constructor.positions(),
                                                    POSITIONS_SECONDS).to_wire())
        if views is None:
            return None
        self._ahead.update((p.step, p) for p in views[1:])
        return views[0]

    def _paced(self, step: int) -> bool:
        """``Constructor.paced``, reporting the streams' positions on the plans stream while it waits:
        the Planner's handler then never waits long for a message (its shutdown waits for it)."""
        while True:
            paced = self.constructor.paced(step, timeout=POSITIONS_SECONDS)
            if paced is not None:
                return paced
            if self._ask_plans(lambda: {"constructor": self.index, "positions": self.constructor.positions()}) is None:
                return False

    def _ask_plans(self, body) -> dict | list[ConstructorPlan] | None:
        """A message on the plans stream (``wire/plan_channel.py``) and its answer (views: their plans, the
        asked step's first), as ``_call_planner``."""
        return self._call_planner(None, body)

    def _call_planner(self, action: str | None, body) -> dict | None:
        """A blocking Planner action (None: a message on the plans stream): again while it times out
        (trainers have not moved on yet), and through a Planner restart; None once this server stops.
        ``body``: a dict, or a callable making it afresh for each try."""
        stopping = lambda: self.constructor.stopping  # noqa: E731

        def one(client):
            message = body() if callable(body) else body
            if action is None:
                return self._plans.ask(client, message)
            return wire.call(client, action, message, timeout=self.cfg.liveness.call_seconds)
        try:
            return ask_again(lambda: call_any(self._clients, [self._planner_location], one, what="planner",
                                              stop=stopping), stop=stopping)
        except Exception:
            if stopping():
                return None
            raise

    def _fetch(self, step: int, plan: ConstructorPlan) -> tuple[dict[int, Sample], dict[str, float]]:
        """Every loader's samples for this step, concurrently (one call per loader process), through
        the decode stage: item index -> sample (or the failure of its decode). With them, how the call
        that finished last spent its time (seconds per source at the loader, the rest network)."""
        calls_done: list[tuple[float, dict[str, float]]] = []  # (end, shares) of each loader call
        deadline = self.cfg.liveness.fetch_seconds  # a hung loader's fetch goes to its shadow (or again) after it

        def one(groups: list[FetchGroup]) -> list[dict]:
            parts = tuple(SamplesPart(g.source, g.actor, tuple(map(tuple, g.samples))) for g in groups)
            request = wire.ticket(SamplesTicket(step, self.index, parts).to_wire())
            start = time.monotonic()
            table = call_any(self._clients, self._loaders.of(groups[0]),
                             lambda c: within(deadline, lambda options: c.do_get(request, options).read_all()),
                             what=f"the loader of {', '.join(sorted({g.source for g in groups}))}",
                             stop=lambda: self.constructor.stopping)
            served = json.loads((table.schema.metadata or {}).get(b"serve_seconds", b"{}"))
            end = time.monotonic()
            calls_done.append((end, fetch_shares(end - start, served)))
            return self.constructor.received(step, plan, groups, table)

        calls = self.constructor.fetch_groups(plan)
        samples = self.constructor.in_plan_order(plan, calls, list(self._pool.map(one, calls)))
        return samples, max(calls_done, key=lambda c: c[0], default=(0.0, {}))[1]

    # -- Flight ------------------------------------------------------------------------
    def do_get(self, context, ticket):
        batch = self._redeemed(context, ticket.ticket, "do_get")
        if batch.kind in STREAM_KINDS:  # one record batch per step, flow-controlled by gRPC (bytes)
            schema, steps = self.constructor.rank_stream(batch.rank, batch.step, batch.end, STREAM_KINDS[batch.kind])
            return fl.GeneratorStream(schema, self._fenced(steps))
        return fl.RecordBatchStream(self.constructor.take(batch.kind, batch.step, batch.rank))

    def do_exchange(self, context, descriptor, reader, writer):
        """A rank stream with credits (``wire/credits.py``): the rank ticket as the descriptor's command;
        a step is taken and sent only once the client's credit allows it."""
        if descriptor.command is None:
            raise ValueError("do_exchange of a constructor takes a rank ticket as the descriptor's command")
        batch = self._redeemed(context, descriptor.command, "do_exchange")
        if batch.kind not in STREAM_KINDS:
            raise ValueError(f"do_exchange takes a rank stream ticket ({', '.join(STREAM_KINDS)}), not {batch.kind!r}")
        credits = CreditReader(reader, batch.step)
        schema, steps = self.constructor.rank_stream(batch.rank, batch.step, batch.end, STREAM_KINDS[batch.kind])
        writer.begin(schema)
        step = batch.step
        for record_batch in self._fenced(steps):  # the next step is taken (and counted served) only after the credit
            writer.write_batch(record_batch)
            step += 1
            if not credits.allows(step, lambda: self.constructor.stopping):
                return

    def _redeemed(self, context, raw: bytes, call: str) -> BatchTicket:
        """A trainer's ticket, checked: its kind, the caller's right to it, its rank and signature."""
        request = wire.decode(raw, "ticket")
        kind = BatchTicket.checked_kind(request)
        self.authorize(context, TRAINER, f"{call} of a {kind!r} ticket")
        batch = BatchTicket.from_wire(request)
        self.authorize(context, TRAINER, f"{call} of a {kind!r} ticket", rank=batch.rank)
        self.constructor.check_rank(batch.rank)
        self.security.verify_ticket(request)  # forged, altered or expired: FlightUnauthorizedError
        return batch

    def _fenced(self, steps):
        """A rank stream that ends this process, not its next step, once it was replaced (``fence.py``)."""
        while True:
            self._check_fence()
            step = next(steps, None)
            if step is None:
                return
            yield step

    def _check_fence(self) -> None:
        if self.fence is not None:
            self.fence.enforce()

    @requires(INSPECT)
    def action_status(self, body):
        """Assembly progress, staged steps, and what each rank was served."""
        return replace(self.constructor.status(), metrics=getattr(self, "metrics_url", None)).to_wire()

    def shutdown(self):
        self.constructor.stop()
        self._plans.close(final=True)  # else the Planner's handler of it holds the Planner's shutdown
        super().shutdown()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._clients.close()
        self._delivered.close()


def main(argv=None) -> None:
    serve(*start(argv))


def start(argv=None) -> tuple[ConstructorServer, str, str | None]:
    """A constructor up, registered and assembling: (server, location, ready file)."""
    parser = role_parser("constructor")
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args(argv)
    cfg = load_config(args.config, expand_files=False)  # it finds the sources' row groups by catalog digest
    host = advertised_host(cfg, args)
    fence = claim_fence(cfg.run_dir, f"constructor-{args.index}")  # before it serves: a hung predecessor is fenced
    server = ConstructorServer(cfg, args.index, args.planner, port=args.port)
    server.fence = fence
    location = location_of(server, host)
    start_metrics(server, cfg, args, "constructor", location)
    register(args.planner, Registration("constructor", location, index=args.index).to_wire(),
             server.security.credentials, call_seconds=cfg.liveness.call_seconds)
    server.start()
    return server, location, args.ready_file
