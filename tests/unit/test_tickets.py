"""Tickets (wire/tickets.py): a per-step ticket names its rank stream's one-step slice, a stream ticket its
stream, a catalog ticket a source's catalog by digest; a malformed one is refused naming what is wrong."""
from __future__ import annotations

import pytest

from flight_overlord.wire.tickets import BatchTicket, CatalogTicket


@pytest.mark.parametrize("raw,streams,end", [
    ({"kind": "batch", "step": 4, "rank": 1}, "batch", 5),
    ({"kind": "encoder", "step": 4, "rank": 1}, "encoder", 5),
    ({"kind": "rank", "step": 4, "rank": 1}, "batch", None),
    ({"kind": "rank", "step": 4, "rank": 1, "end": 9}, "batch", 9),
    ({"kind": "encoder-rank", "step": 4, "rank": 1, "end": 6}, "encoder", 6),
])
def test_a_ticket_names_the_stream_it_reads_and_where_it_ends(raw, streams, end):
    ticket = BatchTicket.from_wire(raw)
    assert (ticket.streams, ticket.step, ticket.end_step) == (streams, 4, end)
    assert BatchTicket.from_wire(ticket.to_wire()) == ticket


@pytest.mark.parametrize("raw,message", [
    ({"kind": "plan", "step": 0, "rank": 0}, "kind 'plan'"),
    ({"kind": "rank", "step": 3, "rank": 0, "end": 3}, "'end' must be an integer after step 3"),
    ({"kind": "batch", "step": "x", "rank": 0}, "step"),
])
def test_a_malformed_ticket_is_refused_naming_what_is_wrong(raw, message):
    with pytest.raises(ValueError, match=message):
        BatchTicket.from_wire(raw)


def test_a_catalog_ticket_names_a_source_and_a_digest():
    ticket = CatalogTicket("web", "5eb664556ff8d65a921ebd36c65571f4")
    assert ticket.to_wire() == {"kind": "catalog", "source": "web", "digest": "5eb664556ff8d65a921ebd36c65571f4"}
    assert CatalogTicket.from_wire(ticket.to_wire()) == ticket


@pytest.mark.parametrize("raw,message", [
    ({"kind": "catalog", "source": "web"}, "missing field 'digest'"),
    ({"kind": "catalog", "digest": "ab12"}, "missing field 'source'"),
    ({"kind": "catalog", "source": "web", "digest": 12}, "field 'digest' must be str"),
    ({"kind": "catalog", "source": "web", "digest": "../../etc/passwd"}, "not a lowercase hexadecimal digest"),
    ({"kind": "catalog", "source": "web", "digest": ""}, "not a lowercase hexadecimal digest"),
])
def test_a_malformed_catalog_ticket_is_refused_naming_the_field(raw, message):
    with pytest.raises(ValueError, match=f"malformed catalog ticket: .*{message}"):
        CatalogTicket.from_wire(raw)
