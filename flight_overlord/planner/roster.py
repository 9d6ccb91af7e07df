"""Who is where: the loader actors (each with its shadows), their row groups, and the constructors."""
from __future__ import annotations

from typing import Callable, Sequence

from ..config import Config
from ..core.order import RowGroupRef, RowGroups
from ..core.scaling import Ownership

CatalogOf = Callable[[str, str, Sequence[str]], RowGroups]  # (source, catalog digest, loaders to ask) -> row groups


ROSTER_FILE = "planner/registry.json"  # in run_dir: the registrations, rewritten at each (a recovery reads them)


class Roster:
    def __init__(self, cfg: Config, num_constructors: int, catalog_of: CatalogOf | None = None):
        """``catalog_of``: the row groups of a catalog a loader registers with (its digest)."""
        self.cfg = cfg
        self.num_constructors = num_constructors
        self.catalog_of = catalog_of
        self.loaders: dict[tuple[str, int], dict[int, str]] = {}  # (source, actor) -> replica -> location
        self.listed: dict[tuple[str, int], RowGroups] = {}  # (source, actor) -> row groups it registered with
        self.catalogs: dict[str, str] = {}  # source -> the digest of the catalog its loaders registered with
        self._catalog: dict[str, RowGroups] = {}  # source -> that catalog: owners by position, no share kept
        self.constructors: dict[int, str] = {}
        self._owner: dict[tuple[str, str, int], tuple[str, int]] = {}  # listed row groups only
        self.ownership: dict[str, Ownership] = {}  # per source, once planning starts: who owns each position

    def register_loader(self, source: str, actor: int, replica: int, location: str, row_groups: list | str) -> None:
        """``replica`` 0 is the active loader actor, 1.. its shadows; ``row_groups``: the actor's, or the
        digest of its source's catalog (the actor owns its share of it, as ``owned_row_groups`` splits)."""
        spec = self.cfg.source(source)
        if not 0 <= actor < self.cfg.provisioned_actors(spec):
            raise ValueError(f"register: actor {actor} out of range for source {source!r} "
                             f"({self.cfg.provisioned_actors(spec)} loaders)")
        if not 0 <= replica <= self.cfg.loader.shadows:
            raise ValueError(f"register: replica {replica} out of range (loader.shadows: {self.cfg.loader.shadows})")
        if isinstance(row_groups, str):
            self._use_catalog(source, actor, row_groups, location)
        else:
            self._list(source, actor, row_groups)
        self.loaders.setdefault((source, actor), {})[replica] = location

    def _list(self, source: str, actor: int, row_groups: list) -> None:
        """An actor registered with its row groups listed: each one's owner noted."""
        refs = RowGroups.of(RowGroupRef(str(f), int(g), int(n)) for f, g, n in row_groups)
        known = self.listed.get((source, actor))
        if known is not None and known != refs:
            raise ValueError(f"register: loader {source}[{actor}] announced different row groups than its peers")
        self.listed[(source, actor)] = refs
        for file, group in zip(refs.file_names(), refs.row_group.tolist()):
            self._owner[(source, file, group)] = (source, actor)

    def catalog_locations(self, source: str, location: str) -> list[str]:
        """The loaders a catalog of ``source`` can be asked for: the one at ``location`` (registering now),
        then the source's other registered ones."""
        others = (loc for (name, _), replicas in sorted(self.loaders.items()) if name == source
                  for loc in replicas.values())
        return list(dict.fromkeys([location, *others]))

    def _use_catalog(self, source: str, actor: int, digest: str, location: str) -> None:
        known = self.catalogs.get(source)
        if known is not None and known != digest:
            raise ValueError(f"register: loader {source}[{actor}] registered with catalog {digest}, its peers with "
                             f"{known}: the source's files differ between its loaders")
        if self.catalog_of is None:
            raise ValueError("register: this Planner takes row groups, not a catalog digest")
        if known is None:  # the source's first registration: its catalog is asked for once
            locations = self.catalog_locations(source, location)
            self.catalogs[source], self._catalog[source] = digest, self.catalog_of(source, digest, locations)

    def register_constructor(self, index: int, location: str) -> None:
        if not 0 <= index < self.num_constructors:
            raise ValueError(f"register: constructor index {index} out of range "
                             f"(this mesh has {self.num_constructors})")
        self.constructors[index] = location

    def complete(self) -> bool:
        actors = sum(self.cfg.provisioned_actors(s) for s in self.cfg.sources)
        replicas = 1 + self.cfg.loader.shadows
        return (sum(len(r) for r in self.loaders.values()) == actors * replicas
                and len(self.constructors) == self.num_constructors)

    def source_row_groups(self, source: str) -> RowGroups:
        if source in self._catalog:
            return self._catalog[source]
        return RowGroups.of(rg for (src, _), refs in self.listed.items() if src == source for rg in refs)

    def share_size(self, source: str, actor: int) -> int:
        """How many row groups an actor owns by the static split (actor i of n: every n-th of the catalog)."""
        if source not in self._catalog:
            return len(self.listed[(source, actor)])
        loaders = self.cfg.source(source).loaders
        return len(range(actor, len(self._catalog[source]), loaders)) if actor < loaders else 0

    def owner(self, source: str, file: str, row_group: int, epoch: int = 0) -> tuple[str, int]:
        """The actor owning a row group in ``epoch``: the static split, or, once the Planner has set the
        sources' ``ownership`` (live resharding), the segment covering its position."""
        if source in self.ownership:
            return source, self.ownership[source].owner(epoch, file, row_group)
        if source in self._catalog:  # actor i of n owns every n-th row group of the sorted catalog
            try:
                return source, self._catalog[source].index(file, row_group) % self.cfg.source(source).loaders
            except KeyError:
                raise KeyError((source, file, row_group)) from None
        return self._owner[(source, file, row_group)]

    def locations(self, actor: tuple[str, int]) -> list[str]:
        """The replicas of one loader actor, active first: any of them can serve its samples."""
        return [loc for _, loc in sorted(self.loaders[actor].items())]

    def state_dict(self) -> dict:
        """Each loader's row groups as its catalog's digest where it registered with one (a few bytes,
        whatever the corpus), else listed."""
        def share(source: str, actor: int):
            if source in self.catalogs:
                return self.catalogs[source]
            return [[rg.file, rg.row_group, rg.num_rows] for rg in self.listed[(source, actor)]]
        return {"loaders": [[s, a, r, loc, share(s, a)]
                            for (s, a), replicas in sorted(self.loaders.items())
                            for r, loc in sorted(replicas.items())],
                "constructors": {str(i): loc for i, loc in sorted(self.constructors.items())}}

    def status(self) -> dict:
        """Who is where, each loader with its number of row groups (the ``status`` answer's ``loaders``)."""
        return {"loaders": [[s, a, r, loc, self.share_size(s, a)]
                            for (s, a), replicas in sorted(self.loaders.items())
                            for r, loc in sorted(replicas.items())],
                "constructors": {str(i): loc for i, loc in sorted(self.constructors.items())}}

    def load_state_dict(self, state: dict) -> None:
        for source, actor, replica, location, row_groups in state["loaders"]:
            self.register_loader(source, actor, replica, location, row_groups)
        for index, location in state["constructors"].items():
            self.register_constructor(int(index), location)
