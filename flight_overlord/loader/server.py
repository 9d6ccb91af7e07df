"""Source Loader host: a thin Flight adapter over one or more :class:`~.actor.LoaderActor` objects.

A loader process hosts any set of loader actors (of any sources): each keeps its own share of
row groups, read state and journal, so adding a source costs its reader state and buffer, not a
process. Tickets name the actor they are for (``source``, ``actor``; optional when the process
hosts one actor). Three kinds of ``do_get`` ticket:
- ``{"kind": "metadata", "source", "actor", "epoch": e, "file": f, "row_group": g}`` (from the
  Planner): make sure that row group is buffered for epoch ``e`` and stream its samples' metadata;
  after a live reshard (``loader.scaling``) it carries the source's ``segments`` (core/scaling.py).
- ``{"kind": "samples", "source", "actor", "step": s, "constructor": c, "samples": [[e, f, g,
  row, consumers], ...]}`` (from a Data Constructor): stream those samples, in order, and pop them.
  ``{"kind": "samples", "step", "constructor", "parts": [{"source", "actor", "samples"}, ...]}``: the
  same for several actors of this process in one call, their tables back to back in ``parts`` order.
- ``{"kind": "buffer"}`` (inspection): the metadata of every buffered, not yet popped sample (with
  ``"source", "actor"``, as the Planner's source endpoints carry: that hosted actor's only).
- ``{"kind": "catalog", "source", "digest"}`` (from the Planner, while this process registers): the
  catalog its actors of that source registered with, as the catalog cache stores it
  (``source_catalog.catalog_table``), for a Planner that has neither that cache nor the files.

``metadata``, ``samples`` and ``catalog`` are internal calls: they need the run's cluster secret. A ``samples``
answer's schema metadata ``serve_seconds`` says how long this process spent on each source's share
(starvation attribution, ``core/starvation.py``; ``faults.slow_sources`` slows a source on purpose).
"""
from __future__ import annotations

import json
import logging
import time

import pyarrow as pa
import pyarrow.flight as fl

from .. import allocator, wire
from ..config import load_config
from ..fence import claim as claim_fence
from ..fence import loader_fence_name
from ..role_process import advertised_host, role_parser, start_metrics
from ..source_catalog import ValidatedCatalogs, catalog_table
from ..wire.schemas import SAMPLE_METADATA, load_schema
from ..wire.security import CLUSTER, INSPECT, Security, requires
from ..wire.server import ActionServer, location_of, register, serve
from ..wire.status import LoaderStatus
from ..wire.tickets import BufferTicket, CatalogTicket, MetadataTicket, Registration, Reshard, SamplesTicket
from .actor import LoaderActor
from .read_ahead import ReadAheadPool
from .row_groups import SourceShare
from .samples_table import samples_table

log = logging.getLogger(__name__)


TICKET_ROLES = {"metadata": CLUSTER, "samples": CLUSTER, "buffer": INSPECT, "catalog": CLUSTER}
CATALOG_ROWS_PER_BATCH = 16384  # files per streamed batch: a 100,000-file catalog goes as a few ~2 MB messages


class LoaderServer(ActionServer):
    def __init__(self, actors: list[LoaderActor], security: Security, *, host: str = "127.0.0.1", port: int = 0,
                 pool: ReadAheadPool | None = None):
        """``pool``: the actors' shared read-ahead workers, closed with the server."""
        # state first: Flight may accept calls during super().__init__
        self.actors = {(a.share.source.name, a.share.actor): a for a in actors}
        self._pool = pool
        super().__init__(host, port, security)

    def _actor(self, source: str | None, actor: int | None) -> LoaderActor:
        """The actor a ticket is for: named by (source, actor), or the only one this process hosts."""
        if source is None:
            if len(self.actors) == 1:
                return next(iter(self.actors.values()))
            raise ValueError("malformed ticket: missing field 'source'")
        if (source, actor) not in self.actors:
            hosted = ", ".join(f"{s}[{a}]" for s, a in sorted(self.actors))
            raise KeyError(f"loader actor {source}[{actor}] is not hosted here (this process hosts: {hosted})")
        return self.actors[(source, actor)]

    def do_get(self, context, ticket):
        request = wire.decode(ticket.ticket, "ticket")
        kind = request.get("kind")
        self.authorize(context, TICKET_ROLES.get(kind, INSPECT) if isinstance(kind, str) else INSPECT,
                       f"do_get of a {kind!r} ticket")
        if kind == "metadata":
            meta = MetadataTicket.from_wire(request)
            return fl.RecordBatchStream(self._actor(meta.source, meta.actor).metadata(
                meta.epoch, meta.file, meta.row_group, meta.segment_lists()))
        if kind == "samples":
            samples = SamplesTicket.from_wire(request)  # several hosted actors: their tables back to back
            return fl.RecordBatchStream(self._samples(samples.step, samples.constructor, samples.parts))
        if kind == "buffer":  # one actor's buffer (the Planner's source endpoints), or every hosted actor's
            buffer = BufferTicket.from_wire(request)
            actors = ([self._actor(buffer.source, buffer.actor)] if buffer.source is not None
                      else list(self.actors.values()))
            return fl.RecordBatchStream(pa.concat_tables([a.buffer_metadata() for a in actors]))
        if kind == "catalog":
            return fl.RecordBatchStream(self._catalog(CatalogTicket.from_wire(request)))
        raise ValueError(f"malformed ticket: unknown kind {kind!r} (loader tickets: 'metadata', 'samples', 'buffer', "
                         f"'catalog')")

    def _catalog(self, ticket: CatalogTicket) -> pa.Table:
        """The catalog a hosted actor of the ticket's source registered with, in batches of a bounded size."""
        shares = [a.share for (source, _), a in sorted(self.actors.items()) if source == ticket.source]
        share = next((s for s in shares if s.catalog_digest == ticket.digest), None)
        if share is None:
            held = ", ".join(sorted({s.catalog_digest for s in shares})) or "none: no actor of it is hosted here"
            raise KeyError(f"catalog {ticket.digest} of source {ticket.source!r} is not this loader's (it has {held})")
        table = catalog_table(share.source, ticket.digest)
        return pa.Table.from_batches(table.to_batches(max_chunksize=CATALOG_ROWS_PER_BATCH), table.schema)

    def _samples(self, step: int, constructor: int, parts) -> pa.Table:
        """The parts' samples back to back, with the seconds spent per source in the schema metadata:
        each actor picks its rows (reading a row group if it must), then one table for them all, as
        a step at many sources asks each actor for a row or two."""
        if len(parts) == 1:  # one actor: its own answer, kept for a retry
            part = parts[0]
            actor, start = self._actor(part.source, part.actor), time.monotonic()
            table = actor.samples(step, constructor, [list(s) for s in part.samples])
            seconds = {actor.share.source.name: time.monotonic() - start}
        else:
            picked, seconds = [], {}
            for part in parts:
                actor, start = self._actor(part.source, part.actor), time.monotonic()
                picked.append((actor, actor.pick(step, constructor, [list(s) for s in part.samples])))
                source = actor.share.source.name
                seconds[source] = seconds.get(source, 0.0) + time.monotonic() - start
            table = samples_table([row for _, rows in picked for row in rows])
            first = 0
            for actor, rows in picked:
                actor.count_served(table.slice(first, len(rows)).nbytes)
                first += len(rows)
        return table.replace_schema_metadata({**(table.schema.metadata or {}),
                                              b"serve_seconds": json.dumps(seconds).encode()})

    def list_flights(self, context, criteria):
        self.authorize(context, INSPECT, "list_flights")
        for (source, index), actor in sorted(self.actors.items()):
            descriptor = fl.FlightDescriptor.for_path("source", source, str(index))
            yield fl.FlightInfo(load_schema(SAMPLE_METADATA), descriptor, [], actor.buffered_samples(), -1)

    @requires(CLUSTER)
    def action_reshard(self, body):
        """The Planner's new ownership segments of a source ({"source", "segments"}), sent when it
        scales (``loader.scaling``): the hosted actors of that source journal them, so an added actor
        starts reading ahead before its first row group is asked for. Metadata tickets carry the same."""
        reshard = Reshard.from_wire(body)
        for (name, _), actor in sorted(self.actors.items()):
            if name == reshard.source:
                actor.reshard(reshard.segment_lists())
        return {"ok": True}

    @requires(INSPECT)
    def action_status(self, body):
        """Buffer occupancy of the hosted loader actors (the fields of the first, and all of them)."""
        return LoaderStatus(tuple(a.status() for _, a in sorted(self.actors.items())),
                            getattr(self, "metrics_url", None)).to_wire()

    def shutdown(self):
        super().shutdown()
        for actor in self.actors.values():
            actor.close()
        if self._pool is not None:
            self._pool.close()


def parse_actors(text: str) -> list[tuple[str, int]]:
    """``"captions:0,captions:1,code:0"`` -> [("captions", 0), ("captions", 1), ("code", 0)]."""
    actors = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        source, _, index = item.rpartition(":")
        if not source or not index.isdigit():
            raise SystemExit(f"overlord serve loader: --actors: {item!r} is not SOURCE:ACTOR")
        actors.append((source, int(index)))
    return actors


def main(argv=None) -> None:
    serve(*start(argv))


def start(argv=None) -> tuple[LoaderServer, str, str | None]:
    """A loader process up with its actors, registered: (server, location, ready file)."""
    parser = role_parser("loader")
    parser.add_argument("--actors", help="the loader actors this process hosts: SOURCE:ACTOR,... "
                        "(or one with --source/--actor)")
    parser.add_argument("--source")
    parser.add_argument("--actor", type=int, default=0)
    parser.add_argument("--replica", type=int, default=0, help="0: the active loader actors; 1..: their shadows")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    host = advertised_host(cfg, args)
    wanted = parse_actors(args.actors) if args.actors else [(args.source, args.actor)] if args.source else []
    if not wanted:
        parser.error("name the loader actors: --actors SOURCE:ACTOR,... or --source S [--actor A]")
    allocator.tame()  # before the actors' threads make arenas: a long run's heap stays flat
    pool = ReadAheadPool()  # the hosted actors' read-ahead: a few threads for the process, not two per actor
    validated = ValidatedCatalogs.from_env()  # overlord up's: its catalogs without a stat per file again
    actors = [LoaderActor(SourceShare(cfg.source(source), index, cfg.global_batch.context_length, cfg.vision,
                                      cfg.provisioned_actors(cfg.source(source)), validated),
                          seed=cfg.seed, read_ahead=cfg.loader.read_ahead_row_groups, run_dir=cfg.run_dir,
                          checkpoint_every=cfg.checkpoint.every, read_ahead_bytes=cfg.loader.read_ahead_bytes,
                          sample_level_bytes=cfg.loader.sample_level_bytes, replicated=cfg.loader.shadows > 0,
                          pool=pool)
              for source, index in wanted]
    security = Security.from_config(cfg)
    fence = claim_fence(cfg.run_dir, loader_fence_name(wanted, args.replica))  # a hung predecessor is fenced
    server = LoaderServer(actors, security, host=cfg.network.host, port=args.port, pool=pool)
    server.fence = fence
    location = location_of(server, host)
    start_metrics(server, cfg, args, "loader", location)
    for actor in actors:
        share = actor.share
        register(args.planner, Registration("loader", location, share.source.name, share.actor, args.replica,
                                            catalog=share.catalog_digest).to_wire(), security.credentials,
                 call_seconds=cfg.liveness.call_seconds)
    return server, location, args.ready_file
