"""A loader actor's journaled state (``loader/state.py``): it round-trips, and folding a journal in is
idempotent, so the active actor, its restart and its shadows reach the same state."""
from __future__ import annotations

from flight_overlord.loader.state import LoaderState

from ..helpers import assert_round_trip


def test_loader_state():
    def advance(s):
        s.apply({"demand": s.demanded + 1})
        s.apply({"fetch": 0, "constructor": 1, "rows": [[s.released_below, 0, 2], [s.released_below + 1, 3, 1]]})
        s.release(s.released_below)
    state = LoaderState()
    advance(state)
    assert_round_trip(state, LoaderState, advance)



def test_loader_state_folds_a_journal_idempotently():
    records = [{"demand": 4}, {"fetch": 0, "constructor": 0, "rows": [[0, 1, 1], [0, 2, 2]]},
               {"fetch": 0, "constructor": 1, "rows": [[0, 2, 2]]}, {"release": 1}]
    once, twice = LoaderState(), LoaderState()
    for r in records:
        once.apply(r)
    for r in records + records:  # a replica that folds its own records in again
        twice.apply(r)
    assert once.state_dict() == twice.state_dict()
    assert once.popped == {0: {1, 2}} and once.partial == {}



def test_a_release_folded_in_twice_is_forgotten_once():
    state = LoaderState()
    for record in [{"release": 0}, {"release": 1}, {"release": 0}, {"release": 1}]:
        state.apply(record)
    assert state.released_below == 2 and state.released == set()
