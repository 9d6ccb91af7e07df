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
NODE = "node"  # the one process of a single_node run: the Planner's address, every role inside
# ``loader.hosts: auto`` puts up to this many actors in one process: an actor spends most of its time in
# Arrow's reads and decompression (GIL released), and a process costs ~64 MiB before any data, so four
# per process keeps that under 16 MiB a source while one process per CPU still bounds the parallelism.
ACTORS_PER_HOST = 4


@dataclass(frozen=True)
class RoleSpec:
    """One role process, as data; ``args`` are its role's own flags made from it (no ``--config``,
    ``--planner``, port or ready file: those say where it runs, which the backend decides)."""
    name: str
    role: str  # planner | loader | constructor | node (all of them in one process)
    resume: bool = False  # the Planner (or node) continues the run in run_dir
    actors: tuple[tuple[str, int], ...] = ()  # a loader process's hosted actors (source, actor)
    replica: int = 0  # a loader process: 0 the active actors, 1.. their shadows
    index: int | None = None  # a constructor's index (its placement follows the ranks it serves)
    standby: bool = False  # a hot standby Planner: follows the Planner instead of registering with it

    @property
    def args(self) -> tuple[str, ...]:
        if self.role == "loader":
            return "--actors", ",".join(f"{s}:{a}" for s, a in self.actors), "--replica", str(self.replica)
        if self.role == "constructor":
            return "--index", str(self.index)
        return ("--resume",) if self.resume else ()


def roles(cfg: Config, *, cpus: int | None = None, resume: bool = False, standbys: bool = True,
          one_process: bool = False) -> list[RoleSpec]:
    """Every role process of a run, the Planner first (the others need its address). ``cpus`` bounds
    ``loader.hosts: auto`` (default: this machine's); ``standbys``: whether the backend runs the config's
    hot standby Planner (a backend that restarts a role in place on its own address may not need one).
    ``one_process``: the backend can run every role of a ``deployment: single_node`` run in one process
    (``overlord serve node``, :mod:`.node`), which it then does unless the run has a standby Planner or
    loader shadows (a replica in the process it stands in for would die with it)."""
    if one_process and hosts_every_role(cfg):
        return [RoleSpec(NODE, NODE, resume=resume)]
    specs = [RoleSpec("planner", "planner", resume=resume)]
    if standbys and cfg.planner.standbys:
        specs.append(RoleSpec(STANDBY, "planner", standby=True))
    specs += [RoleSpec(name + (f"-shadow{r}" if r else ""), "loader", actors=tuple(actors), replica=r)
              for name, actors in loader_hosts(cfg, cpus) for r in range(1 + cfg.loader.shadows)]
    specs += [RoleSpec(f"constructor-{c}", "constructor", index=c)
              for c in range(cfg.num_constructors)]
    return specs


def hosts_every_role(cfg: Config) -> bool:
    """A ``deployment: single_node`` run without standby Planner or loader shadows: one process serves it."""
    return cfg.deployment == "single_node" and not cfg.planner.standbys and not cfg.loader.shadows


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
