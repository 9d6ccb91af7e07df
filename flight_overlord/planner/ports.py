"""What ``PlanService`` asks of other roles, as small protocols: their Flight implementation is
``calls.PlannerCalls``; a unit test gives in-memory fakes (``tests/unit/test_plan_service.py``). The
Planner's own port is its ``fetch_meta`` (a source's row-group metadata: ``PlannerCalls.meta_fetcher``)."""
from __future__ import annotations

from typing import Protocol

from ..wire.tickets import Reshard


class Liveness(Protocol):
    def answers(self, location: str) -> bool:
        """Whether a registered role still answers at ``location``."""


class Reshards(Protocol):
    def announce(self, reshards: list[tuple[str, Reshard]]) -> None:
        """Tell each location its scaled source's new segments (best effort)."""


class RoleCalls(Liveness, Reshards, Protocol):
    """What ``PlanService`` calls: a registered role's liveness, reshard announcements."""
