"""Offline source auto-partitioning (the paper's section 5.1), as pure logic: a profile in, a plan out.

Given each source's profile (its transform cost per sample, its weight, its row groups and the
memory one loader actor of it holds) and a budget (CPUs and memory for the loader hosts), the plan
says how many loader actors each source gets and which loader host (process) runs which actors:

1. Cost. A source's share of the loaders' CPU is ``weight x seconds per token`` (weights are token
   shares, so this is its transform seconds per trained token), normalised over the sources.
2. Hosts. One host per CPU of the budget (a host runs its actors' reads in one Python process),
   never more hosts than actors.
3. Actors. A source whose cost share is more than one host's CPU gets ``ceil(share x hosts)``
   actors (reason ``cpu``); a source one actor of which does not fit one host's share of the
   memory budget gets more actors, each holding fewer of its files (reason ``memory``); both are
   capped by the source's row groups. A source that fits nowhere is an error naming it.
4. Grouping. Sources are sorted by cost (the paper's source clustering), and their actors are
   dealt onto the hosts longest-processing-time first: each to the host with the least cost that
   still has memory for it (ties: the lower host index). Deterministic: the same profile and
   budget give the same plan.

Nothing here does I/O: ``loader/profile.py`` measures the profile and journals profile and plan.
Which process hosts an actor, and how many actors a source has, never change the streams (the read
order is per source), so any plan is safe to apply or to change between runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

MiB = 1024 * 1024
GiB = 1024 * MiB
HOST_BASE_BYTES = 64 * MiB  # a loader host process before any source (Python, pyarrow, Flight): measured ~60 MiB


@dataclass(frozen=True)
class SourceProfile:
    """What one source costs, as ``overlord partition`` measured it."""
    name: str
    weight: float                # the config's weight (a token share)
    row_groups: int
    files: int
    rows: int
    mean_tokens: float           # tokens per sample after the transform
    seconds_per_sample: float    # read + transform, per sample
    seconds_per_byte: float      # read + transform, per input byte
    row_group_bytes: float       # one transformed row group as buffered (tokens, keys, images)
    reader_bytes: float          # file states of the whole source: footers and handles

    @property
    def seconds_per_token(self) -> float:
        return self.seconds_per_sample / max(self.mean_tokens, 1.0)


@dataclass(frozen=True)
class Budget:
    cpus: float
    memory_bytes: float

    def check(self) -> "Budget":
        for name, value in (("cpus", self.cpus), ("memory", self.memory_bytes)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"partition budget: {name} must be a positive number, got {value!r}")
        if self.cpus < 1:
            raise ValueError(f"partition budget: cpus must be >= 1 (one loader host per CPU), got {self.cpus}")
        return self


@dataclass(frozen=True)
class SourcePlan:
    name: str
    actors: int
    cost_share: float            # of the loaders' transform CPU
    actor_bytes: float           # memory of one of its actors
    reasons: tuple[str, ...]     # why it has more than one actor


@dataclass(frozen=True)
class PartitionPlan:
    sources: tuple[SourcePlan, ...]
    hosts: tuple[tuple[tuple[str, int], ...], ...]  # per host: its (source, actor)s
    host_cost: tuple[float, ...]
    host_bytes: tuple[float, ...]
    budget: Budget
    read_ahead_row_groups: int
    notes: tuple[str, ...] = field(default=())

    def actors(self, name: str) -> int:
        return next(s.actors for s in self.sources if s.name == name)

    def to_dict(self) -> dict:
        return {"sources": [{"name": s.name, "actors": s.actors, "cost_share": s.cost_share,
                             "actor_bytes": s.actor_bytes, "reasons": list(s.reasons)} for s in self.sources],
                "hosts": [[[src, a] for src, a in host] for host in self.hosts],
                "host_cost": list(self.host_cost), "host_bytes": list(self.host_bytes),
                "budget": {"cpus": self.budget.cpus, "memory_bytes": self.budget.memory_bytes},
                "read_ahead_row_groups": self.read_ahead_row_groups, "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, d: dict) -> "PartitionPlan":
        return cls(tuple(SourcePlan(s["name"], int(s["actors"]), float(s["cost_share"]), float(s["actor_bytes"]),
                                    tuple(s["reasons"])) for s in d["sources"]),
                   tuple(tuple((str(src), int(a)) for src, a in host) for host in d["hosts"]),
                   tuple(map(float, d["host_cost"])), tuple(map(float, d["host_bytes"])),
                   Budget(float(d["budget"]["cpus"]), float(d["budget"]["memory_bytes"])),
                   int(d["read_ahead_row_groups"]), tuple(d.get("notes", ())))


def actor_bytes(p: SourceProfile, actors: int, read_ahead: int, read_ahead_bytes: int = 0) -> float:
    """One actor's memory: its share of the source's file states, the row group being served and
    ``read_ahead`` more (fewer under ``loader.read_ahead_bytes``: it reads ahead while below it)."""
    if read_ahead_bytes and p.row_group_bytes > 0:
        read_ahead = min(read_ahead, max(0, math.ceil(read_ahead_bytes / p.row_group_bytes) - 1))
    return p.reader_bytes / actors + (1 + read_ahead) * p.row_group_bytes


def plan_partition(profiles: list[SourceProfile], budget: Budget, *, read_ahead_row_groups: int = 2,
                   read_ahead_bytes: int = 0, host_base_bytes: float = HOST_BASE_BYTES) -> PartitionPlan:
    """The partition plan for ``profiles`` within ``budget`` (see the module's docstring)."""
    budget.check()

    def actor_bytes_(p: SourceProfile, actors: int, read_ahead: int) -> float:
        return actor_bytes(p, actors, read_ahead, read_ahead_bytes)
    if not profiles:
        raise ValueError("partition: no sources to plan")
    names = [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise ValueError(f"partition: duplicate source names in the profile: {sorted(names)}")
    for p in profiles:
        if p.row_groups < 1:
            raise ValueError(f"partition: source {p.name!r} has no row groups")
    raw_cost = {p.name: max(p.weight, 0.0) * p.seconds_per_token for p in profiles}
    total = sum(raw_cost.values())
    share = {n: (c / total if total > 0 else 1.0 / len(profiles)) for n, c in raw_cost.items()}
    # the paper's source clustering: sources in descending cost (ties by name)
    ordered = sorted(profiles, key=lambda p: (-share[p.name], p.name))
    max_hosts = int(budget.cpus)
    hosts = min(max_hosts, sum(p.row_groups for p in profiles))
    cap = budget.memory_bytes / hosts - host_base_bytes  # one host's share of the budget, for its actors
    if cap <= 0:
        raise ValueError(f"partition budget: memory {budget.memory_bytes / GiB:.2f} GiB over {hosts} loader hosts "
                         f"leaves nothing for their actors (a host process needs ~{host_base_bytes / MiB:.0f} MiB)")
    plans = {}
    for p in ordered:
        reasons, actors = [], 1
        need_cpu = math.ceil(share[p.name] * hosts - 1e-9)
        if need_cpu > 1:
            actors = min(need_cpu, p.row_groups, hosts)
            reasons.append(f"cpu: {share[p.name]:.0%} of the transform cost > one host's {1 / hosts:.0%}")
        if actor_bytes_(p, actors, read_ahead_row_groups) > cap:
            fit = next((a for a in range(actors, p.row_groups + 1) if actor_bytes_(p, a, read_ahead_row_groups) <= cap),
                       None)
            if fit is None:
                raise ValueError(
                    f"partition: source {p.name!r} does not fit the memory budget: one actor needs at least "
                    f"{actor_bytes_(p, p.row_groups, read_ahead_row_groups) / MiB:.1f} MiB (row group "
                    f"{p.row_group_bytes / MiB:.1f} MiB, buffered with what it reads ahead) but a "
                    f"host has {cap / MiB:.1f} MiB ({budget.memory_bytes / GiB:.2f} GiB over {hosts} hosts); give "
                    f"more memory, or lower loader.read_ahead_row_groups or set loader.read_ahead_bytes")
            reasons.append(f"memory: one actor {actor_bytes_(p, actors, read_ahead_row_groups) / MiB:.1f} MiB > a "
                           f"host's {cap / MiB:.1f} MiB; {fit} actors hold "
                           f"{actor_bytes_(p, fit, read_ahead_row_groups) / MiB:.1f} MiB each")
            actors = fit
        plans[p.name] = SourcePlan(p.name, actors, share[p.name], actor_bytes_(p, actors, read_ahead_row_groups),
                                   tuple(reasons))
    # grouping: longest processing time first onto the least-loaded host with room
    items = sorted(((share[p.name] / plans[p.name].actors, plans[p.name].actor_bytes, p.name, a)
                    for p in ordered for a in range(plans[p.name].actors)), key=lambda x: (-x[0], -x[1], x[2], x[3]))
    cost, used, members = [0.0] * hosts, [0.0] * hosts, [[] for _ in range(hosts)]
    for c, b, name, a in items:
        room = [h for h in range(hosts) if used[h] + b <= cap]
        if not room:
            raise ValueError(f"partition: the memory budget {budget.memory_bytes / GiB:.2f} GiB is too small: "
                             f"actor {name}[{a}] ({b / MiB:.1f} MiB) fits on none of the {hosts} loader hosts "
                             f"(the actors need {sum(x[1] for x in items) / GiB:.2f} GiB + "
                             f"{hosts * host_base_bytes / GiB:.2f} GiB for the hosts)")
        h = min(room, key=lambda h: (cost[h], used[h], h))
        cost[h] += c
        used[h] += b
        members[h].append((name, a))
    kept = [h for h in range(hosts) if members[h]]
    notes = []
    if budget.cpus != max_hosts:
        notes.append(f"{budget.cpus:g} CPUs: {max_hosts} loader hosts (one per whole CPU)")
    return PartitionPlan(
        sources=tuple(plans[p.name] for p in ordered),
        hosts=tuple(tuple(sorted(members[h])) for h in kept),
        host_cost=tuple(cost[h] for h in kept), host_bytes=tuple(used[h] + host_base_bytes for h in kept),
        budget=budget, read_ahead_row_groups=read_ahead_row_groups, notes=tuple(notes))


def render(plan: PartitionPlan, profiles: list[SourceProfile] | None = None) -> str:
    """The plan and its reasons as a text table: per source (cost, memory, actors, why), then per host."""
    prof = {p.name: p for p in profiles or ()}
    lines = [f"partition plan: {sum(s.actors for s in plan.sources)} loader actors for {len(plan.sources)} sources "
             f"on {len(plan.hosts)} loader hosts; budget {plan.budget.cpus:g} CPUs, "
             f"{plan.budget.memory_bytes / GiB:.2f} GiB; read-ahead {plan.read_ahead_row_groups} row groups",
             "", f"{'source':<16} {'cost':>6} {'us/sample':>9} {'row group MiB':>13} {'actor MiB':>9} "
                 f"{'actors':>6}  why",
             ]
    for s in plan.sources:
        p = prof.get(s.name)
        us = f"{p.seconds_per_sample * 1e6:.1f}" if p else "-"
        rg = f"{p.row_group_bytes / MiB:.2f}" if p else "-"
        lines.append(f"{s.name:<16} {s.cost_share:>6.1%} {us:>9} {rg:>13} {s.actor_bytes / MiB:>9.1f} {s.actors:>6}  "
                     + ("; ".join(s.reasons) or "-"))
    lines += ["", f"{'host':<8} {'cost':>6} {'MiB':>8}  actors"]
    for h, (members, c, b) in enumerate(zip(plan.hosts, plan.host_cost, plan.host_bytes)):
        shown = ", ".join(f"{n}[{a}]" for n, a in members[:8]) + (f", ... ({len(members)})" if len(members) > 8 else "")
        lines.append(f"{h:<8} {c:>6.1%} {b / MiB:>8.1f}  {shown}")
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


# What one process serving every role of a run holds before any buffer (the interpreter, pyarrow, the
# Planner's and the constructor's state): the node's PSS at 6 sources, docs/results.md (~70-75 MiB), rounded up.
NODE_BASE_BYTES = 96 * MiB


def single_node_advice(plan: PartitionPlan) -> str:
    """The deployment for ranks that share one machine with this budget (its cores and memory): one
    process for every role (``deployment: single_node``: the Planner, one loader host for every actor,
    one constructor for every data-parallel rank) when the planned loader buffers fit the memory with it.
    The choice is measured (``benchmarks/memory/peers.py``, docs/results.md): at 6 and 96 sources, 2 and 8
    ranks, it is ahead of MosaicML Streaming on samples/s and on memory, and uses the least memory of
    our deployments; it uses about one core, so it suits a node of any core count from one on."""
    needed = sum(plan.host_bytes) + NODE_BASE_BYTES
    if needed > plan.budget.memory_bytes:
        return (f"single node: the loader buffers and one process ({needed / GiB:.2f} GiB) exceed the memory "
                f"budget ({plan.budget.memory_bytes / GiB:.2f} GiB): lower loader.read_ahead_bytes, or spread "
                f"the loader hosts over several nodes (the default deployment)")
    return (f"single node ({plan.budget.cpus:g} CPUs, {plan.budget.memory_bytes / GiB:.2f} GiB): recommended "
            f"`deployment: single_node` (every role in one process: the Planner, one loader host for all "
            f"{sum(s.actors for s in plan.sources)} actors, one constructor for every data-parallel rank; about "
            f"{needed / GiB:.2f} GiB and one core), measured ahead of MosaicML Streaming on samples/s and memory "
            f"(docs/results.md); the hosts above are for the default deployment")


def apply_plan(cfg, plan: PartitionPlan):
    """``cfg`` (a Config) with the plan's actors per source and its loader hosts (``loader.groups``)."""
    planned = {s.name: s.actors for s in plan.sources}
    have = {s.name for s in cfg.sources}
    if set(planned) != have:
        raise ValueError(f"the partition plan is for sources {sorted(planned)}, the config has {sorted(have)}: "
                         f"run `overlord partition CONFIG` again")
    sources = tuple(replace(s, loaders=planned[s.name]) for s in cfg.sources)
    return replace(cfg, sources=sources, loader=replace(cfg.loader, groups=plan.hosts))
