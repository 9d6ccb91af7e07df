"""What the Planner's logic asks of other roles, as small protocols: its Flight implementation is
``calls.PlannerCalls``; a unit test gives in-memory fakes (``tests/unit/test_plan_service.py``)."""
from __future__ import annotations

from typing import Protocol

from ..wire.tickets import Reshard
from .feed import FetchMeta


class Metadata(Protocol):
    def meta_fetcher(self, source: str) -> FetchMeta:
        """A source's row-group metadata, as its loaders send it."""


class Liveness(Protocol):
    def answers(self, location: str) -> bool:
        """Whether a registered role still answers at ``location``."""


class Reshards(Protocol):
    def announce(self, reshards: list[tuple[str, Reshard]]) -> None:
        """Tell each location its scaled source's new segments (best effort)."""


class RoleCalls(Liveness, Reshards, Protocol):
    """What ``PlanService`` calls: a registered role's liveness, reshard announcements."""
