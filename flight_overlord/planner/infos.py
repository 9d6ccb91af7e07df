"""The Planner's descriptors and FlightInfos, for its Flight adapter: what a trainer's or an inspector's
descriptor names (checked, with an error naming what is wrong), and the FlightInfo that answers it
(the serving constructor's location and a ticket signed with the run's secret, or a source's loaders)."""
from __future__ import annotations

import pyarrow.flight as fl

from .. import wire
from ..config import Config
from ..wire.schemas import ENCODER_BATCH, HDP_MICROBATCH, MICROBATCH, load_schema
from ..wire.security import Security
from ..wire.tickets import BatchTicket, BufferTicket, RankStream
from .strategy import Strategy

DESCRIPTORS = ("('batch', STEP, RANK), ('encoder', STEP, RANK), ('rank', RANK[, FIRST[, END]]), "
               "('encoder-rank', RANK[, FIRST[, END]]) and ('source', NAME)")


def descriptor_parts(descriptor: fl.FlightDescriptor) -> list[str]:
    return [p.decode() if isinstance(p, bytes) else p for p in (descriptor.path or [])]


class FlightInfos:
    def __init__(self, cfg: Config, strategy: Strategy, security: Security):
        self.cfg = cfg
        self.strategy = strategy
        self.mesh = strategy.mesh
        self.security = security

    def batch(self, parts: list[str]) -> tuple[int, int]:
        """(step, rank) of a ``("batch"|"encoder", STEP, RANK)`` descriptor."""
        try:
            step, rank = int(parts[1]), int(parts[2])
        except ValueError:
            raise ValueError(f"malformed descriptor {parts!r}: step and rank must be integers") from None
        if step < 0:
            raise ValueError(f"malformed descriptor {parts!r}: step must be >= 0")
        self.mesh.coord(rank)  # ValueError naming the rank if outside the mesh
        return step, rank

    def check_encoder(self, kind: str) -> None:
        if kind in ("encoder", "encoder-rank") and self.strategy.image_graph is None:
            raise KeyError(f"no encoder streams ({kind!r}): this run's strategy has no image graph "
                           f"(images travel with their sequences in ('batch', STEP, RANK) and ('rank', RANK))")

    def schema(self, kind: str):
        """A rank's batches (microbatch rows, or under distribute('HDP') rows of per-sequence groups), or
        its encoder inputs."""
        if kind in ("encoder", "encoder-rank"):
            return load_schema(ENCODER_BATCH)
        return load_schema(HDP_MICROBATCH if self.strategy.axis == "HDP" else MICROBATCH)

    def rank_info(self, descriptor, stream: RankStream, first: int, location: str) -> fl.FlightInfo:
        """One endpoint at the rank's constructor (``location``) whose ticket streams the rank's steps
        (or its encoder inputs) from ``first`` on."""
        signed = self.security.sign_ticket(stream.kind, first, stream.rank)
        ticket = BatchTicket(stream.kind, first, stream.rank, signed, stream.end)
        endpoint = fl.FlightEndpoint(wire.ticket(ticket.to_wire()), [location])
        return fl.FlightInfo(self.schema(stream.kind), descriptor, [endpoint], -1, -1)

    def batch_info(self, descriptor, step: int, rank: int, location: str, kind: str = "batch") -> fl.FlightInfo:
        endpoint = fl.FlightEndpoint(wire.ticket(self.security.sign_ticket(kind, step, rank)), [location])
        records = -1 if kind == "encoder" else self.cfg.global_batch.microbatches
        return fl.FlightInfo(self.schema(kind), descriptor, [endpoint], records, -1)

    @staticmethod
    def source_info(descriptor, schema, rows: int, loaders: list[tuple[tuple[str, int], list[str]]]) -> fl.FlightInfo:
        """A source's metadata: one endpoint per loader actor (its buffer), at its locations."""
        endpoints = [fl.FlightEndpoint(wire.ticket(BufferTicket(*actor).to_wire()), locations)
                     for actor, locations in loaders]
        return fl.FlightInfo(schema, descriptor, endpoints, rows, -1)
