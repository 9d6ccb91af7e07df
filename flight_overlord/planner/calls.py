"""The Planner's calls to other roles, over Flight: a loader's row-group metadata, a reshard
announced to a source's loaders, the steps a constructor served, whether a registered address
still answers, and the catalog a loader registered with (``CatalogCalls``). Where each call goes
is the logic's (``routes.LoaderRoutes``); this is the I/O."""
from __future__ import annotations

import logging
import threading

import numpy as np
import pyarrow as pa

from .. import wire
from ..core.order import RowGroupRef
from ..wire.security import Credentials
from ..wire.server import ANSWERED, ClientPool, call_any, connect, probe, within
from ..wire.tickets import CatalogTicket, Reshard
from .feed import FetchMeta, row_group_metadata
from .routes import LoaderRoutes

log = logging.getLogger(__name__)
SERVED_SECONDS = 10.0  # how long a rejoining rank's question waits for its constructor's word


class PlannerCalls:
    """The Flight side of the Planner's ports: its ``fetch_meta`` (``meta_fetcher``), ``ports.RoleCalls``."""

    def __init__(self, credentials: Credentials, routes: LoaderRoutes, *, fetch_seconds: float = 300.0):
        """``fetch_seconds``: the deadline of one metadata fetch (``liveness.fetch_seconds``)."""
        self.credentials = credentials
        self.routes = routes
        self.fetch_seconds = fetch_seconds
        self.clients = ClientPool(credentials)
        self._stopping = threading.Event()  # the Planner shuts down: a metadata fetch gives up

    def stop(self) -> None:
        self._stopping.set()

    def close(self) -> None:
        self.stop()
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

    def announce(self, reshards: list[tuple[str, Reshard]]) -> None:
        """Send each (location, reshard), in the background (a down loader learns it from its journal
        or its next metadata ticket)."""
        def send():
            for location, reshard in reshards:
                try:
                    wire.call(self.clients.get(location), "reshard", reshard.to_wire(), timeout=10)
                except Exception as exc:  # noqa: BLE001 - best effort: tickets carry the segments too
                    log.warning("reshard of %s at %s not delivered (%s); its tickets carry it", reshard.source,
                                location, exc)
        threading.Thread(target=send, name="reshard", daemon=True).start()

    def meta_fetcher(self, source: str) -> FetchMeta:
        """A source's row-group metadata, from the loader that owns each row group (or a replica of it)."""
        def fetch(epoch: int, rg: RowGroupRef) -> dict[str, np.ndarray]:
            request, actor = self.routes.metadata_request(source, epoch, rg)
            ticket = wire.ticket(request.to_wire())
            table = call_any(self.clients, lambda: self.routes.locations(actor),  # a moved loader too
                             lambda c: within(self.fetch_seconds, lambda options: c.do_get(ticket, options).read_all()),
                             what=f"loader {source}[{actor[1]}]", stop=self._stopping.is_set)
            return row_group_metadata(table, rg.num_rows)
        return fetch


class CatalogCalls:
    """A catalog from the loader that registered with it (``catalogs.CatalogFetch``), on a connection of its
    own: it is asked once per source, while that loader waits for its ``register`` call to be answered."""

    def __init__(self, credentials: Credentials, seconds: float):
        """``seconds``: the deadline of one fetch. The loader's ``register`` call waits ``liveness.call_seconds``
        for its answer, which this fetch is part of: half of that leaves room to fall back to the files."""
        self.credentials = credentials
        self.seconds = seconds

    def __call__(self, location: str, source: str, digest: str) -> pa.Table:
        ticket = wire.ticket(CatalogTicket(source, digest).to_wire())
        client = connect(location, self.credentials)
        try:
            return within(self.seconds, lambda options: client.do_get(ticket, options).read_all())
        finally:
            client.close()
