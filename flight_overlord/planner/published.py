"""Planned steps' views, held from planning until every constructor has taken its own (a later ask is
served from the journal), and the registrations that make them stale: an encoded view names its
loaders' locations, so a role registering at a new location drops every held view.

No lock of its own: ``PlanService`` holds its lock around every call."""
from __future__ import annotations

from ..wire.plan import EncodedPlan


class PublishedViews:
    def __init__(self, constructors: int):
        self._constructors = constructors
        self._views: dict[int, list[EncodedPlan]] = {}
        self._taken: dict[int, set[int]] = {}
        self.registrations = 0  # roles registered at a new location so far
        self.publishing: int | None = None  # the step planned whose views are being made (not served yet)

    def moved(self) -> None:
        """A role registered at a new location: the held views may name its old one."""
        self.registrations += 1
        self._views.clear()
        self._taken.clear()

    def publish(self, step: int, views: list[EncodedPlan], registrations: int) -> None:
        """Hold ``step``'s views, made when ``registrations`` roles had registered at a new location
        (none since: else they are not held, and the step is served from the journal)."""
        self.publishing = None
        if registrations == self.registrations:
            self._views[step] = views
            self._taken[step] = set()

    def take(self, step: int, constructor: int) -> EncodedPlan | None:
        """The constructor's view of a published step, if still held; dropped once every constructor
        has taken its own."""
        views = self._views.get(step)
        if views is None:
            return None
        self._taken[step].add(constructor)
        if len(self._taken[step]) == self._constructors:
            del self._views[step], self._taken[step]
        return views[constructor]
