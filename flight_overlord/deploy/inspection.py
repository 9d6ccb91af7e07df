"""``overlord inspect ADDRESS``: what a server offers, using only the stock Flight API.

list_flights -> get_flight_info -> get_schema -> do_get (following the endpoint's
location), so it doubles as proof that any Flight client can read our streams. With
``credentials`` (a token, and a CA / client certificate under TLS) every call carries them.
"""
from __future__ import annotations

import pyarrow.flight as fl

from ..wire.security import Credentials
from ..wire.server import connect, refusal


def _describe(descriptor: fl.FlightDescriptor) -> str:
    if descriptor.path:
        return "/".join(p.decode() if isinstance(p, bytes) else p for p in descriptor.path)
    return repr(descriptor.command)


def inspect_server(address: str, *, rows: int = 2, max_flights: int = 20,
                   credentials: Credentials | None = None) -> None:
    client = connect(address, credentials)
    try:
        actions = list(client.list_actions())
        print(f"{address}\nactions: " + ", ".join(f"{a.type}" for a in actions))
        flights = list(client.list_flights())
        print(f"flights: {len(flights)}")
        for info in flights[:max_flights]:
            where = ", ".join(loc.uri.decode() for ep in info.endpoints for loc in ep.locations) or "-"
            print(f"  {_describe(info.descriptor):<28} records={info.total_records:<6} endpoints: {where}")
        batch = next((f for f in flights if f.descriptor.path and f.descriptor.path[0] in (b"batch", "batch")), None)
        if batch is None:
            return
        schema = client.get_schema(batch.descriptor).schema
        print(f"\nschema of {_describe(batch.descriptor)}:\n{schema}")
        try:
            info = client.get_flight_info(batch.descriptor)
            endpoint = info.endpoints[0]
            server = connect(endpoint.locations[0].uri.decode(), credentials) if endpoint.locations else client
            table = server.do_get(endpoint.ticket).read_all()
        except (fl.FlightUnauthenticatedError, fl.FlightUnauthorizedError) as exc:
            print(f"\nno stream head: {refusal(exc)}")  # reading a rank's data is a trainer call
            return
        print(f"\nhead of the stream ({table.num_rows} rows, {table.nbytes:,} bytes):")
        for row in table.slice(0, rows).to_pylist():
            print("  " + ", ".join(f"{k}={_short(v)}" for k, v in row.items()))
    finally:
        client.close()


def _short(value, limit: int = 8) -> str:
    if isinstance(value, list) and len(value) > limit:
        return f"[{', '.join(map(repr, value[:limit]))}, ... ({len(value)} items)]"
    return repr(value)
