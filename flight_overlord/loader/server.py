"""Source Loader: a thin Flight adapter over one :class:`~.actor.LoaderActor`.

Three kinds of ``do_get`` ticket:
- ``{"kind": "metadata", "epoch": e, "file": f, "row_group": g}`` (from the Planner): make
  sure that row group is buffered for epoch ``e`` and stream its samples' metadata.
- ``{"kind": "samples", "step": s, "constructor": c, "samples": [[e, f, g, row, consumers], ...]}``
  (from a Data Constructor): stream those samples, in that order, and pop them.
- ``{"kind": "buffer"}`` (inspection): the metadata of every buffered, not yet popped sample.

``metadata`` and ``samples`` are internal calls: they need the run's cluster secret.
"""
from __future__ import annotations

import argparse
import logging

import pyarrow.flight as fl

from .. import wire
from ..config import load_config
from ..wire.schemas import SAMPLE_METADATA, load_schema
from ..wire.security import CLUSTER, INSPECT, Security, requires
from ..wire.server import ActionServer, location_of, register, serve
from .actor import LoaderActor
from .partition import SourcePartition

log = logging.getLogger(__name__)


TICKET_ROLES = {"metadata": CLUSTER, "samples": CLUSTER, "buffer": INSPECT}


class LoaderServer(ActionServer):
    def __init__(self, actor: LoaderActor, security: Security, *, host: str = "127.0.0.1", port: int = 0):
        self.actor = actor  # state first: Flight may accept calls during super().__init__
        super().__init__(host, port, security)

    def do_get(self, context, ticket):
        request = wire.decode(ticket.ticket, "ticket")
        kind = request.get("kind")
        self.authorize(context, TICKET_ROLES.get(kind, INSPECT) if isinstance(kind, str) else INSPECT,
                       f"do_get of a {kind!r} ticket")
        if kind == "metadata":
            return fl.RecordBatchStream(self.actor.metadata(wire.field(request, "epoch", int, "metadata ticket"),
                                                            wire.field(request, "file", str, "metadata ticket"),
                                                            wire.field(request, "row_group", int, "metadata ticket")))
        if kind == "samples":
            return fl.RecordBatchStream(self.actor.samples(wire.field(request, "step", int, "samples ticket"),
                                                           wire.field(request, "constructor", int, "samples ticket"),
                                                           _checked_samples(request)))
        if kind == "buffer":
            return fl.RecordBatchStream(self.actor.buffer_metadata())
        raise ValueError(f"malformed ticket: unknown kind {kind!r} (loader tickets: 'metadata', 'samples', 'buffer')")

    def list_flights(self, context, criteria):
        self.authorize(context, INSPECT, "list_flights")
        source = self.actor.partition.source.name
        descriptor = fl.FlightDescriptor.for_path("source", source, str(self.actor.partition.actor))
        yield fl.FlightInfo(load_schema(SAMPLE_METADATA), descriptor, [], self.actor.buffered_samples(), -1)

    @requires(INSPECT)
    def action_status(self, body):
        """Buffer occupancy of this loader."""
        return self.actor.status()

    def shutdown(self):
        super().shutdown()
        self.actor.close()


def _checked_samples(request: dict) -> list[list]:
    wanted = wire.field(request, "samples", list, "samples ticket")
    for item in wanted:
        if not (isinstance(item, list) and len(item) in (4, 5) and isinstance(item[1], str)
                and all(isinstance(v, int) and not isinstance(v, bool) for v in item[:1] + item[2:])):
            raise ValueError(f"malformed samples ticket: sample {item!r} is not "
                             f"[epoch, file, row_group, row] or [epoch, file, row_group, row, consumers]")
    return wanted


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="overlord serve loader")
    parser.add_argument("--config", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--actor", type=int, default=0)
    parser.add_argument("--replica", type=int, default=0, help="0: the active loader actor; 1..: its shadows")
    parser.add_argument("--planner", required=True, help="grpc://host:port (or grpc+tls://) of the Planner")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    partition = SourcePartition(cfg.source(args.source), args.actor, cfg.global_batch.context_length, cfg.vision)
    actor = LoaderActor(partition, seed=cfg.seed, read_ahead=cfg.loader.read_ahead_row_groups, run_dir=cfg.run_dir,
                        checkpoint_every=cfg.checkpoint.every)
    security = Security.from_config(cfg)
    server = LoaderServer(actor, security, host=cfg.network.host, port=args.port)
    location = location_of(server, cfg.network.host)
    register(args.planner, {"role": "loader", "source": args.source, "actor": args.actor, "replica": args.replica,
                            "location": location,
                            "row_groups": [[rg.file, rg.row_group, rg.num_rows] for rg in partition.row_groups]},
             security.credentials)
    serve(server, location, args.ready_file)
