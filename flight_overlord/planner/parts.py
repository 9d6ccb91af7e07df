"""The Planner role's parts, built in one place, each given what it uses: the routes to the loaders
(roster and live resharding, ``LoaderRoutes``), the calls to other roles over Flight
(``PlannerCalls``), the planning logic (``Planner``) and the service around it (``PlanService``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..config import Config
from ..wire.security import Credentials
from .audit import mark_run_start
from .calls import CatalogCalls, PlannerCalls
from .planner import Planner
from .routes import LoaderRoutes
from .service import PlanService
from .strategy import Strategy


@dataclass
class PlannerParts:
    calls: PlannerCalls
    planner: Planner
    service: PlanService

    @classmethod
    def build(cls, cfg: Config, strategy: Strategy, credentials: Credentials, *, resume: bool, recover: bool,
              guard: Callable[[], None] | None = None) -> "PlannerParts":
        """``resume``: continue the run in ``run_dir`` from its journal; ``recover``: also take the
        registrations of the roles still running; ``guard``: checked before every journal record."""
        routes = LoaderRoutes.of(cfg, strategy.mesh.num_constructors,
                                 CatalogCalls(credentials, seconds=cfg.liveness.call_seconds / 2))
        calls = PlannerCalls(credentials, routes, fetch_seconds=cfg.liveness.fetch_seconds)
        planner = Planner(cfg, strategy, calls.meta_fetcher, routes)
        planner.open(resume=resume or recover, guard=guard)
        if not recover:  # a new segment of the run (overlord audit tells what a resume rolled back)
            mark_run_start(cfg, planner.mixture, resume=resume)
        return cls(calls, planner, PlanService(cfg, planner, calls, resumed=resume, recover=recover))

    def close(self) -> None:
        """After the service stopped and the server shut down."""
        self.calls.close()
        self.planner.close()
