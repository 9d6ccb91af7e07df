"""The Planner's calls to other roles, over Flight: a loader's row-group metadata, a reshard
announced to a source's loaders, the steps a constructor served, and whether a registered address
still answers."""
from __future__ import annotations

import logging
import threading
from typing import Callable

import numpy as np

from .. import wire
from ..core.order import RowGroupRef
from ..wire.security import Credentials
from ..wire.server import ANSWERED, ClientPool, call_any, connect, probe, within
from ..wire.tickets import MetadataTicket, Reshard
from .feed import row_group_metadata
from .planner import Planner

log = logging.getLogger(__name__)
SERVED_SECONDS = 10.0  # how long a rejoining rank's question waits for its constructor's word


class PlannerCalls:
    def __init__(self, credentials: Credentials, stopping: Callable[[], bool], *, fetch_seconds: float = 300.0):
        """``stopping()``: whether the Planner is shutting down (a metadata fetch then gives up);
        ``fetch_seconds``: the deadline of one metadata fetch (``liveness.fetch_seconds``)."""
        self.credentials = credentials
        self.fetch_seconds = fetch_seconds
        self.clients = ClientPool(credentials)
        self.stopping = stopping
        self.planner: Planner | None = None  # set once built (it is built with ``meta_fetcher``)

    def close(self) -> None:
        self.clients.close()

    def answers(self, location: str) -> bool:
        """Whether a role's registered address still answers (any reply, even an error, counts), on a
        fresh channel (a pooled one may be in reconnect back-off)."""
        try:
            client = connect(location, self.credentials)
        except Exception:  # noqa: BLE001 - an unusable address does not answer
            return False
        try:
            return probe(client, 3.0) == ANSWERED
        finally:
            client.close()

    def served_steps(self, location: str) -> dict[int, int]:
        """{rank: the last step handed to its stream} of the constructor at ``location`` (its ``status``);
        {} when it does not answer within ``SERVED_SECONDS`` (restarting: the Planner's own positions stand)."""
        try:
            served = wire.call(self.clients.get(location), "status", timeout=SERVED_SECONDS)["served"]
        except Exception as exc:  # noqa: BLE001 - a down constructor leaves the Planner's positions
            log.warning("constructor at %s did not say what it served (%s): positions as last reported", location, exc)
            return {}
        return {int(rank): int(entry["step"]) for rank, entry in served.items()}

    def announce_reshard(self, events: list[dict]) -> None:
        """Send a scaled source's new segments to every replica of its actors, in the background (a
        down loader learns them from its journal or its next metadata ticket)."""
        jobs = {(e["source"], loc): self.planner.scaling.segments[e["source"]] for e in events
                for (source, _), replicas in sorted(self.planner.registry.loaders.items()) if source == e["source"]
                for loc in replicas.values()}

        def send():
            for (source, location), segments in jobs.items():
                try:
                    wire.call(self.clients.get(location), "reshard",
                              Reshard(source, tuple(map(tuple, segments))).to_wire(), timeout=10)
                except Exception as exc:  # noqa: BLE001 - best effort: tickets carry the segments too
                    log.warning("reshard of %s at %s not delivered (%s); its tickets carry it", source, location, exc)
        threading.Thread(target=send, name="reshard", daemon=True).start()

    def meta_fetcher(self, source: str):
        def fetch(epoch: int, rg: RowGroupRef) -> dict[str, np.ndarray]:
            actor = self.planner.registry.owner(source, rg.file, rg.row_group, epoch)
            segments = self.planner.scaling.segments_of(source) if self.planner.scaling is not None else None
            # a resharded source: its actors learn (and journal) the ownership from the ticket
            request = MetadataTicket(source, actor[1], epoch, rg.file, rg.row_group,
                                     tuple(map(tuple, segments)) if segments else None)
            table = call_any(self.clients, lambda: self.planner.registry.locations(actor),  # a moved loader too
                             lambda c: within(self.fetch_seconds,
                                              lambda options: c.do_get(wire.ticket(request.to_wire()), options).read_all()),
                             what=f"loader {source}[{actor[1]}]", stop=self.stopping)
            return row_group_metadata(table, rg.num_rows)
        return fetch
