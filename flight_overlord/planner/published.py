"""Planned steps' constructor plans, held from planning until every constructor has taken its own (a later
ask is served from the journal), and the registrations that make them stale: an encoded plan names its
loaders' locations, so a role registering at a new location drops every held plan.

No lock of its own: ``PlanService`` holds its lock around every call."""
from __future__ import annotations

from ..wire.plan import EncodedPlan


class PublishedPlans:
    def __init__(self, constructors: int):
        self._constructors = constructors
        self._plans: dict[int, list[EncodedPlan]] = {}
        self._taken: dict[int, set[int]] = {}
        self.registrations = 0  # roles registered at a new location so far
        self.publishing: int | None = None  # the step planned whose constructor plans are being made (not served yet)

    def moved(self) -> None:
        """A role registered at a new location: the held plans may name its old one."""
        self.registrations += 1
        self._plans.clear()
        self._taken.clear()

    def publish(self, step: int, plans: list[EncodedPlan], registrations: int) -> None:
        """Hold ``step``'s constructor plans, made when ``registrations`` roles had registered at a new location
        (none since: else they are not held, and the step is served from the journal)."""
        self.publishing = None
        if registrations == self.registrations:
            self._plans[step] = plans
            self._taken[step] = set()

    def take(self, step: int, constructor: int) -> EncodedPlan | None:
        """The constructor's plan of a published step, if still held; dropped once every constructor
        has taken its own."""
        plans = self._plans.get(step)
        if plans is None:
            return None
        self._taken[step].add(constructor)
        if len(self._taken[step]) == self._constructors:
            del self._plans[step], self._taken[step]
        return plans[constructor]
