"""``planner/published.py``: a step's constructor plans are held until every constructor took its own, and
a registration at a new address drops every held plan (they name the old one)."""
from __future__ import annotations

from flight_overlord.planner.published import PublishedPlans


def test_plans_are_held_until_every_constructor_took_its_own():
    held = PublishedPlans(2)
    held.publishing = 4
    held.publish(4, ["plan of 0", "plan of 1"], registrations=0)
    assert held.publishing is None
    assert held.take(4, 1) == "plan of 1"
    assert held.take(4, 1) == "plan of 1"  # asked again (a reconnect): still held for constructor 0
    assert held.take(4, 0) == "plan of 0"
    assert held.take(4, 0) is None and held.take(5, 0) is None  # let go: served from the journal


def test_a_move_drops_held_plans_and_those_made_before_it():
    held = PublishedPlans(2)
    held.publish(1, ["a", "b"], registrations=0)
    made_with = held.registrations
    held.moved()
    assert held.take(1, 0) is None
    held.publish(2, ["c", "d"], registrations=made_with)  # made while the role moved: may name its old address
    assert held.take(2, 0) is None
    held.publish(3, ["e", "f"], registrations=held.registrations)
    assert held.take(3, 0) == "e"
