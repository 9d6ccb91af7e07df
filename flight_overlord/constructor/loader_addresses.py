"""Where a loader actor is served now. A plan names the addresses its loaders had when it was planned; a
loader host that came back on a new address (a rescheduled pod) re-registers there with the Planner, so
while the plan's addresses do not answer, a constructor's fetch asks the Planner (its ``('source', NAME)``
flight: one endpoint per actor) for the current ones."""
from __future__ import annotations

import time
from typing import Callable

import pyarrow.flight as fl

from .. import wire
from ..wire.plan import FetchGroup
from ..wire.server import ClientPool
from ..wire.tickets import BufferTicket

ASK_SECONDS = 0.5  # at most this often per fetch: a loader's restart takes longer, a Planner call ~1 ms
ASK_TIMEOUT = 2.0  # a Planner that is itself restarting does not hold the fetch's retries up for long


class LoaderAddresses:
    def __init__(self, clients: ClientPool, planner: str):
        self._clients = clients
        self._planner = planner

    def of(self, group: FetchGroup) -> Callable[[], list[str]]:
        """``call_any``'s locations for ``group``'s loader: the plan's first, then the Planner's (the
        plan's while the Planner does not tell)."""
        known, asked = list(group.locations), None  # the time of the last question (None: first round)

        def locations() -> list[str]:
            nonlocal known, asked
            if asked is None:
                asked = time.monotonic() - ASK_SECONDS  # the next round asks
            elif time.monotonic() - asked >= ASK_SECONDS:
                asked = time.monotonic()
                known = self.registered(group.source, group.actor) or known
            return known
        return locations

    def registered(self, source: str, actor: int) -> list[str] | None:
        """The actor's registered addresses (active first), or None if the Planner does not answer."""
        try:
            info = self._clients.get(self._planner).get_flight_info(
                fl.FlightDescriptor.for_path("source", source), fl.FlightCallOptions(timeout=ASK_TIMEOUT))
        except fl.FlightUnavailableError:
            self._clients.forget(self._planner)
            return None
        except (fl.FlightError, OSError):  # a Planner still loading (or timing out): ask again later
            return None
        for endpoint in info.endpoints:
            ticket = BufferTicket.from_wire(wire.decode(endpoint.ticket.ticket, "ticket"))
            if (ticket.source, ticket.actor) == (source, actor):
                return [location.uri.decode() for location in endpoint.locations]
        return None
