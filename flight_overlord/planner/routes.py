"""Where the Planner's calls to loaders go, without Flight: a row group's metadata request and the
addresses that serve it, and the loaders a reshard is announced to. The roster (who registered
where) and the live resharding (which actor owns a row group) are shared by the Planner, which
changes them, and its calls (``calls.PlannerCalls``), which read them to address a request."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import Config
from ..core.order import RowGroupRef
from ..wire.tickets import MetadataTicket, Reshard
from .catalogs import CatalogCache, CatalogFetch
from .roster import Roster
from .scaling import SourceScaling


@dataclass
class LoaderRoutes:
    roster: Roster
    scaling: SourceScaling | None  # None: no live resharding (``loader.scaling`` off)

    @classmethod
    def of(cls, cfg: Config, num_constructors: int, fetch_catalog: CatalogFetch | None = None) -> "LoaderRoutes":
        """``fetch_catalog``: a catalog the Planner lacks, from a loader that registered with it."""
        return cls(Roster(cfg, num_constructors, CatalogCache(cfg, fetch_catalog)),
                   SourceScaling(cfg) if cfg.loader.scaling.enabled else None)

    def metadata_request(self, source: str, epoch: int, rg: RowGroupRef) -> tuple[MetadataTicket, tuple[str, int]]:
        """The ticket of a row group's metadata, and the loader actor that owns it. A resharded source's
        ticket carries its segments: its actors learn (and journal) the ownership from it."""
        actor = self.roster.owner(source, rg.file, rg.row_group, epoch)
        segments = self.scaling.segments_of(source) if self.scaling is not None else None
        return MetadataTicket(source, actor[1], epoch, rg.file, rg.row_group,
                              tuple(map(tuple, segments)) if segments else None), actor

    def locations(self, actor: tuple[str, int]) -> list[str]:
        """Where an actor is served now (a moved loader too): the active process first, then shadows."""
        return self.roster.locations(actor)

    def reshards(self, events: list[dict]) -> list[tuple[str, Reshard]]:
        """(location, reshard) to announce: each scaled source's segments to every replica of its actors,
        once per process."""
        sends = {(e["source"], location): Reshard(e["source"], tuple(map(tuple, self.scaling.segments[e["source"]])))
                 for e in events for (source, _), replicas in sorted(self.roster.loaders.items())
                 if source == e["source"] for location in replicas.values()}
        return [(location, reshard) for (_, location), reshard in sends.items()]
