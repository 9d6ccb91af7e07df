"""Which role processes a run has, as pure data from the config: the one list every backend starts.

``roles(cfg)`` names each role process (``planner``, ``planner-standby``, ``loader-host0``,
``loader-host0-shadow1``, ``constructor-0``), its role and its own flags; the backend adds where it
runs (ports, ready files, Ray placement) and the Planner's address once the Planner serves. Which
process hosts a loader actor changes nothing in the streams: the read order is per source.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..config import Config

STANDBY = "planner-standby"  # the hot standby Planner's name (planner.standbys: 1)
# ``loader.hosts: auto`` puts up to this many actors in one process: an actor spends most of its time in
# Arrow's reads and decompression (GIL released), and a process costs ~64 MiB before any data, so four
# per process keeps that under 16 MiB a source while one process per CPU still bounds the parallelism.
ACTORS_PER_HOST = 4


@dataclass(frozen=True)
class RoleSpec:
    """One role process: ``args`` are its role's own flags (no ``--config``, ``--planner``, port or
    ready file: those say where it runs, which the backend decides)."""
    name: str
    role: str  # planner | loader | constructor
    args: tuple[str, ...] = ()
    index: int | None = None  # a constructor's index (its placement follows the ranks it serves)
    standby: bool = False  # a hot standby Planner: follows the Planner instead of registering with it

    def actors(self) -> list[str]:
        """A loader process's hosted actors (``SOURCE:ACTOR``); [] for other roles."""
        return self.args[self.args.index("--actors") + 1].split(",") if "--actors" in self.args else []

    def replica(self) -> int:
        return int(self.args[self.args.index("--replica") + 1]) if "--replica" in self.args else 0


def roles(cfg: Config, *, cpus: int | None = None, resume: bool = False, standbys: bool = True) -> list[RoleSpec]:
    """Every role process of a run, the Planner first (the others need its address). ``cpus`` bounds
    ``loader.hosts: auto`` (default: this machine's); ``standbys``: whether the backend runs the config's
    hot standby Planner (a backend that restarts a role in place on its own address may not need one)."""
    specs = [RoleSpec("planner", "planner", ("--resume",) if resume else ())]
    if standbys and cfg.planner.standbys:
        specs.append(RoleSpec(STANDBY, "planner", standby=True))
    specs += [RoleSpec(name + (f"-shadow{r}" if r else ""), "loader",
                       ("--actors", ",".join(f"{s}:{a}" for s, a in actors), "--replica", str(r)))
              for name, actors in loader_hosts(cfg, cpus) for r in range(1 + cfg.loader.shadows)]
    specs += [RoleSpec(f"constructor-{c}", "constructor", ("--index", str(c)), index=c)
              for c in range(cfg.num_constructors)]
    return specs


def machine_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def loader_hosts(cfg: Config, cpus: int | None = None) -> list[tuple[str, list[tuple[str, int]]]]:
    """(process name, the loader actors it hosts). ``cpus`` (default: this machine's) bounds the
    processes of ``loader.hosts: auto``. With ``loader.scaling`` a source's idle actors
    (``loaders`` .. ``max_actors`` - 1, activated by a live reshard) live in the process of its actor
    ``a % loaders``: pre-provisioned, so no process is started mid-run, every actor has its journal and
    shadows from the start, and an idle one costs its catalog, not a process."""
    hosts = _hosts_of_configured_actors(cfg, cpus)
    where = {actor: i for i, (_, actors) in enumerate(hosts) for actor in actors}
    for s in cfg.sources:
        for a in range(s.loaders, cfg.provisioned_actors(s)):
            hosts[where[(s.name, a % s.loaders)]][1].append((s.name, a))
    return hosts


def _hosts_of_configured_actors(cfg: Config, cpus: int | None) -> list[tuple[str, list[tuple[str, int]]]]:
    """(process name, the loader actors it hosts): with ``loader.hosts: N`` the actors dealt round robin
    onto N processes (``loader-hostH``); ``auto`` (the default) is N = min(ceil(actors / ACTORS_PER_HOST),
    CPUs); 0, or N >= the actors, is one process per actor (``loader-SOURCE-ACTOR``)."""
    if cfg.loader.groups:  # loader.partition: auto: the plan's hosts (clusters of sources by cost)
        return [(f"loader-host{h}", list(group)) for h, group in enumerate(cfg.loader.groups)]
    actors = [(s.name, a) for s in cfg.sources for a in range(s.loaders)]
    hosts = cfg.loader.hosts
    if hosts == "auto":
        hosts = min(-(-len(actors) // ACTORS_PER_HOST), cpus or machine_cpus())
    if not hosts or hosts >= len(actors):
        return [(f"loader-{s}-{a}", [(s, a)]) for s, a in actors]
    return [(f"loader-host{h}", actors[h::hosts]) for h in range(hosts)]
