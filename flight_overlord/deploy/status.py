"""One look at a running deployment: every role's ``status`` action, reached through the Planner.

``cluster_status(planner)`` asks the Planner where every loader replica and constructor is (its
``status`` action lists them), then asks each of them for its own ``status``, and returns one dict::

    {"up": bool,                       # every role answered
     "planner": ROLE, "loaders": [ROLE, ...], "constructors": [ROLE, ...],
     "totals": {"roles", "roles_up", "down", "bytes_served", "bytes_served_by_source",
                "bytes_fetched", "bad_samples", "buffered_samples"},
     "cost": {"model", "a", "b", "fit", ...},  # the cost model in force (fitted with cost.fit)
     "starvation": {"ranks": {RANK: {"waited", "stages", "cause", "starved"}},
                    "causes": [{"stage", "source", "ranks", "seconds"}, ...]}}  # why ranks waited for data

where a ROLE is ``{"role", "address", "up", "reason", "counters", ...}``: ``counters`` is what the
role's ``status`` action answered (``{}`` when it did not), ``reason`` why it is down (None when up).
Loaders also carry ``source``, ``actor``, ``replica`` and ``row_groups`` (how many the Planner has
registered for the actor), constructors ``index``. A role that does not answer within ``timeout`` is
reported down, never raised; if the Planner itself is down, the other roles are unknown (empty lists).
Totals are summed over the roles that answered.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import wire
from ..core.starvation import summarize, with_trainer_side
from ..wire.security import Credentials
from ..wire.server import ClientPool
from ..wire.status import ConstructorStatus, LoaderActorStatus, LoaderStatus, PlannerStatus


def cluster_status(planner_address: str, *, timeout: float = 10.0, pool: ClientPool | None = None,
                   credentials: Credentials | None = None) -> dict:
    """The status of the deployment whose Planner is at ``planner_address`` (see the module doc).

    ``pool``: reuse these clients (kept open) across calls; by default a pool is made and closed here,
    with ``credentials`` (the run's, ``LocalCluster.credentials``, when inspection needs a token or
    the run uses TLS).
    """
    own_pool = pool is None
    pool = pool or ClientPool(credentials)
    try:
        planner = _ask(pool, planner_address, timeout, role="planner")
        answer = planner.pop("counters")
        planner["counters"] = {k: answer[k] for k in ("ready", "planned", "requested", "error", "scaling", "cost",
                                                      "mixture") if k in answer}
        where = PlannerStatus.from_wire(answer) if planner["up"] else PlannerStatus()
        loaders = [{"role": "loader", "source": source, "actor": actor, "replica": replica, "address": location,
                    "row_groups": row_groups}
                   for source, actor, replica, location, row_groups in where.loaders]
        constructors = [{"role": "constructor", "index": int(index), "address": location}
                        for index, location in sorted(where.constructors.items(), key=lambda kv: int(kv[0]))]
        roles = loaders + constructors
        if roles:
            with ThreadPoolExecutor(max_workers=min(16, len(roles)), thread_name_prefix="status") as threads:
                answers = list(threads.map(lambda r: _ask(pool, r["address"], timeout), roles))
            for role, answered in zip(roles, answers):
                role.update(answered)
                if role["role"] == "loader" and role["up"]:  # a host answers for all its actors: keep this one's
                    mine = [a for a in LoaderStatus.from_wire(role["counters"]).actors
                            if (a.source, a.actor) == (role["source"], role["actor"])]
                    role["counters"] = mine[0].to_wire() if mine else role["counters"]
    finally:
        if own_pool:
            pool.close()
    everyone = [planner, *roles]
    return {"up": all(r["up"] for r in everyone), "planner": planner, "loaders": loaders,
            "constructors": constructors, "totals": _totals(everyone, loaders, constructors),
            "cost": planner["counters"].get("cost"), "starvation": _starvation(answer, constructors)}


def _starvation(planner: dict, constructors: list[dict]) -> dict:
    """Every rank's data waits by stage (what its constructor measured plus what its trainer reported), the
    main cause of each, and the causes with the ranks they starve (``core/starvation.py``)."""
    sides = {int(rank): stages for c in constructors for rank, stages in c["counters"].get("waits", {}).items()}
    trainers = planner.get("trainer_waits") if isinstance(planner.get("trainer_waits"), dict) else {}
    ranks = sorted(set(sides) | {int(r) for r in trainers})
    summary = summarize({r: with_trainer_side(sides.get(r, {}), trainers.get(str(r))) for r in ranks})
    for rank, entry in summary["ranks"].items():
        entry["starved"] = (trainers.get(rank) or {}).get("starved")  # the training loop's own idle time
    return summary


def _ask(pool: ClientPool, address: str, timeout: float, **identity) -> dict[str, Any]:
    """``status`` of the role at ``address``: up with its counters, or down with the reason."""
    try:
        counters = wire.call(pool.get(address), "status", {}, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - unreachable, timed out, refused: all mean "down" here
        return {**identity, "address": address, "up": False, "reason": f"{type(exc).__name__}: {exc}",
                "counters": {}}
    return {**identity, "address": address, "up": True, "reason": None,
            "counters": counters if isinstance(counters, dict) else {}}


def _totals(everyone: list[dict], loaders: list[dict], constructors: list[dict]) -> dict:
    loader_counters = [(lo["source"], LoaderActorStatus.from_wire({"source": lo["source"], "actor": lo["actor"],
                                                                   **lo["counters"]})) for lo in loaders]
    fetched = [ConstructorStatus.from_wire({"index": c["index"], **c["counters"]}) for c in constructors]
    by_source: dict[str, int] = {}
    for source, counters in loader_counters:
        by_source[source] = by_source.get(source, 0) + int(counters.bytes_served)
    return {
        "roles": len(everyone),
        "roles_up": sum(r["up"] for r in everyone),
        "down": [_name(r) for r in everyone if not r["up"]],
        "bytes_served": sum(by_source.values()),
        "bytes_served_by_source": by_source,
        "bytes_fetched": sum(int(c.bytes_fetched) for c in fetched),
        "bad_samples": sum(len(c.bad_samples) for c in fetched),
        "buffered_samples": sum(int(c.buffered_samples) for _, c in loader_counters),
    }


def _name(role: dict) -> str:
    if role["role"] == "loader":
        return f"loader {role['source']}[{role['actor']}] replica {role['replica']} at {role['address']}"
    if role["role"] == "constructor":
        return f"constructor {role['index']} at {role['address']}"
    return f"planner at {role['address']}"


def render(status: dict) -> str:
    """The status as a terminal page: roles up or down, progress per rank, each source's loaders."""
    planner, totals = status["planner"], status["totals"]
    counters = planner.get("counters", {})
    lines = [f"planner {planner['address']}: {'up' if planner['up'] else 'DOWN ' + str(planner['reason'])}; "
             f"planned up to step {counters.get('planned', '?')}; roles up {totals['roles_up']}/{totals['roles']}"
             + (f"; planning error: {counters['error']}" if counters.get("error") else "")]
    requested = counters.get("requested") or {}
    if requested:
        lines.append("ranks (step asked last): " + " ".join(f"{r}:{s}" for r, s in sorted(requested.items(),
                                                                                         key=lambda kv: int(kv[0]))))
    lines.append(f"{'loader':<28} {'address':<24} {'state':<6} {'buffered':>9} {'bytes served':>14}")
    for loader in status["loaders"]:
        c = loader["counters"]
        name = f"{loader['source']}[{loader['actor']}]" + (f" shadow {loader['replica']}" if loader["replica"] else "")
        lines.append(f"{name:<28} {loader['address']:<24} {'up' if loader['up'] else 'DOWN':<6} "
                     f"{c.get('buffered_samples', 0):>9,} {c.get('bytes_served', 0):>14,}")
    lines.append(f"{'constructor':<28} {'address':<24} {'state':<6} {'assembled':>9} {'bytes fetched':>14}")
    for constructor in status["constructors"]:
        c = constructor["counters"]
        lines.append(f"{constructor['index']:<28} {constructor['address']:<24} "
                     f"{'up' if constructor['up'] else 'DOWN':<6} {c.get('assembled', -1):>9} "
                     f"{c.get('bytes_fetched', 0):>14,}" + (f"  error: {c['error']}" if c.get("error") else ""))
    lines.extend(_cost_lines(counters.get("cost")))
    lines.extend(starvation_lines(status.get("starvation")))
    mixture = counters.get("mixture") or {}
    if mixture.get("weights"):  # the weights in force, and live changes (overlord mix) not reached yet
        lines.append("mixture in force: " + " ".join(f"{s}={w:.3f}" for s, w in mixture["weights"].items()))
    for change in mixture.get("pending", []):
        lines.append(f"  from step {change['step']}: " + " ".join(f"{s}={w:.3f}" for s, w in change["weights"].items()))
    if mixture.get("skips"):  # overlord skip / the config's skip: windows of steps whose samples are dropped
        lines.append("skipped steps (their samples dropped): " + ", ".join(f"{w[0]}-{w[1]}" for w in mixture["skips"]))
    scaling = counters.get("scaling")
    if scaling:  # loader.scaling: active actors per source, and the latest live reshards
        lines.append("scaling: active actors " + " ".join(f"{s}:{n}" for s, n in sorted(scaling["actors"].items())))
        for e in scaling["events"][-5:]:
            lines.append(f"  step {e['step']}: {e['source']} {e['previous']} -> {e['actors']} actors "
                         f"(weight per actor {e['load']:.3f}; row groups from read-order slot {e['boundary']} on)")
    if totals["down"]:
        lines.append("down: " + ", ".join(totals["down"]))
    return "\n".join(lines) + "\n"


def _cost_lines(cost: dict | None, what: str = "cost") -> list[str]:
    """The cost model in force: as configured, or fitted to the trainers' timings (cost.fit)."""
    if not cost or cost.get("a") is None:
        return []
    if "encoder" in cost:
        return _cost_lines({k: v for k, v in cost.items() if k != "encoder"}) + _cost_lines(
            {"fit": True, **cost["encoder"]}, "encoder cost")
    line = f"{what}: {cost['model']} a={cost['a']:.6g} b={cost['b']:.6g}"
    if cost.get("a"):
        line += f" (b/a {cost['b'] / cost['a']:.6g})"
    if not cost.get("fit"):
        return [line + " as configured"]
    if cost.get("fitted"):
        line += (f" fitted from {cost['observations']} timings through step {cost['through_step']} "
                 f"({cost['rejected']} outliers rejected), in force since step {cost['since_step']}")
    else:
        line += " (the prior: no timings yet)"
    waiting = cost.get("waiting_for")
    if waiting:
        line += f"; planning waits for the timings of step {waiting['step']} from buckets {waiting['buckets']}"
    return [line]


def starvation_lines(starvation: dict | None) -> list[str]:
    """Which stage (and source) starves which ranks, largest first."""
    if not starvation or not starvation.get("causes"):
        return []
    lines = ["starvation (recent data waits, by cause):"]
    for cause in starvation["causes"]:
        what = f"loader fetch of source {cause['source']!r}" if cause["source"] else cause["stage"]
        ranks = ",".join(str(r) for r in cause["ranks"])
        lines.append(f"  {what} starves ranks {ranks} ({cause['seconds']:.2f} s)")
    return lines
