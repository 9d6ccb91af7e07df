"""Data Constructor: the Flight adapter of a :class:`~.constructor.Constructor`.

The constructor's assembly loop runs in a thread of its own (``loop.py``), its plans from the Planner
and its samples from the loaders through ``flight_io.py``. Trainers redeem tickets signed by the
Planner (checked here): a ``"rank"`` ticket (``"end"`` optional) streams the rank's steps from ``step``
on, one record batch each, on one long-lived ``do_get`` (or a ``do_exchange`` with credits,
``wire/credits.py``); an ``"encoder-rank"`` ticket likewise streams the images its vision encoder
processes (image graph); a ``"batch"`` or ``"encoder"`` ticket of one step (the per-step descriptor
of a stock client) is that stream's one-step slice. Redeeming is a trainer call, ``status`` an
inspection call; the constructor's own calls to the Planner and loaders carry the cluster secret.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import replace

import pyarrow.flight as fl

from .. import wire
from ..config import Config, load_config
from ..fence import claim as claim_fence
from ..planner.strategy import load_strategy
from ..role_process import advertised_host, role_parser, start_metrics
from ..wire.credits import CreditReader
from ..wire.security import INSPECT, TRAINER, Security, requires
from ..wire.server import ActionServer, ClientPool, location_of, register, serve
from ..wire.tickets import STREAM_KINDS, BatchTicket, Registration
from .constructor import Constructor
from .deliveries import DeliveryJournal
from .flight_io import FlightPlanSource, FlightSampleSource

log = logging.getLogger(__name__)


class ConstructorServer(ActionServer):
    """The Flight adapter of a :class:`~.constructor.Constructor`: its loop's plan and sample sources
    over Flight, and ``do_get`` / ``do_exchange`` of a rank's staged tables."""

    def __init__(self, cfg: Config, index: int, planner: str, *, port: int = 0, security: Security | None = None):
        self.cfg = cfg
        security = security or Security.from_config(cfg)
        self.index = index
        self._stopping = threading.Event()
        self._delivered = DeliveryJournal(cfg.run_dir, index)  # what was served, for `overlord audit`
        self._clients = ClientPool(security.credentials)
        io = {"stopping": self._stopping.is_set, "check_fence": self._check_fence}
        self._plans = FlightPlanSource(cfg, index, self._clients, planner, **io)
        self.constructor = Constructor(cfg, index, load_strategy(cfg, cfg.mesh), plans=self._plans,
                                       samples=FlightSampleSource(cfg, index, self._clients, planner, **io),
                                       on_served=self._delivered.served, on_rewind=self._delivered.rewound)
        self.mesh = self.constructor.mesh
        self.ranks = self.constructor.ranks
        super().__init__(cfg.network.host, port, security)

    def start(self) -> None:
        threading.Thread(target=self.constructor.run, name="assemble", daemon=True).start()

    # -- Flight ------------------------------------------------------------------------
    def do_get(self, context, ticket):
        """A rank stream, or its one-step slice: one record batch per step, flow-controlled by gRPC (bytes)."""
        batch = self._redeemed(context, ticket.ticket, "do_get")
        schema, steps = self.constructor.rank_stream(batch.rank, batch.step, batch.end_step, batch.streams)
        return fl.GeneratorStream(schema, self._fenced(steps))

    def do_exchange(self, context, descriptor, reader, writer):
        """A rank stream with credits (``wire/credits.py``): the rank ticket as the descriptor's command;
        a step is taken and sent only once the client's credit allows it."""
        if descriptor.command is None:
            raise ValueError("do_exchange of a constructor takes a rank ticket as the descriptor's command")
        batch = self._redeemed(context, descriptor.command, "do_exchange")
        if batch.kind not in STREAM_KINDS:  # credits pace a stream that goes on; a one-step ticket is a do_get
            raise ValueError(f"do_exchange takes a rank stream ticket ({', '.join(STREAM_KINDS)}), not {batch.kind!r}")
        credits = CreditReader(reader, batch.step)
        schema, steps = self.constructor.rank_stream(batch.rank, batch.step, batch.end_step, batch.streams)
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
        self._stopping.set()
        self.constructor.stop()
        self._plans.close()
        super().shutdown()
        self._clients.close()
        self._delivered.close()


def main(argv=None) -> None:
    serve(*start(argv))


def start(argv=None) -> tuple[ConstructorServer, str, str | None]:
    """A constructor up, registered and assembling: (server, location, ready file)."""
    parser = role_parser("constructor")
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args(argv)
    cfg = load_config(args.config, expand_files=False)  # it reads no source file: its plans name the row groups
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
