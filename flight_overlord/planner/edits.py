"""Mixture edits: what the config says about the mixture, live reweighting, and the checks a resume
with an edited config must pass before any role starts.

A run's mixture may change between a stop and ``overlord up CONFIG --resume`` (sources added,
dropped, reweighted, a source's loader count) and live (``overlord mix``). A continuing source goes
on from its cursor, a new one starts at epoch 0, a dropped one keeps its cursor in the Planner's
state (re-adding it continues there). What cannot be honoured is refused by ``check_sources`` before any role starts.
"""
from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import Config, ConfigError

if TYPE_CHECKING:
    from ..source_catalog import ValidatedCatalogs

log = logging.getLogger(__name__)
CATALOGS = Path("planner") / "sources.json"  # per source: a digest of its files when first seen
MIXTURE = Path("planner") / "mixture.json"  # the mixture of the latest start (sources, weights, loaders)


def mixture_of(cfg: Config) -> dict:
    """The part of a config that decides the mixture: the sources with their weights and loader
    counts, and the strategy file that may program the schedule."""
    strategy = None
    if cfg.strategy is not None:
        strategy = [str(cfg.strategy.file), cfg.strategy.function, cfg.strategy.options]
    return {"sources": {s.name: {"weight": s.weight, "loaders": s.loaders, "shuffle_window": s.shuffle_window}
                        for s in cfg.sources},
            "strategy": strategy}


def describe_edit(before: dict, after: dict) -> dict:
    """What changed between two ``mixture_of`` answers: added, dropped and reweighted sources."""
    old, new = before.get("sources", {}), after.get("sources", {})
    return {"added": sorted(set(new) - set(old)), "dropped": sorted(set(old) - set(new)),
            "reweighted": sorted(s for s in set(old) & set(new) if old[s]["weight"] != new[s]["weight"]),
            "loaders": sorted(s for s in set(old) & set(new) if old[s]["loaders"] != new[s]["loaders"]),
            "strategy": before.get("strategy") != after.get("strategy")}


class MixOverrides:
    """Live reweighting (``overlord mix``): weights that replace the schedule's from a step on.
    Plain state: a list of [step, weights], in the order they were set."""

    def __init__(self):
        self.changes: list[tuple[int, dict[str, float]]] = []

    def add(self, step: int, weights: dict[str, float]) -> None:
        self.changes.append((int(step), {k: float(v) for k, v in weights.items()}))

    def weights_at(self, step: int) -> dict[str, float] | None:
        """The weights set for ``step`` (the latest change at or before it), None when none applies."""
        applying = [w for at, w in self.changes if at <= step]
        return dict(applying[-1]) if applying else None

    def starts_at(self, step: int) -> bool:
        return any(at == step for at, _ in self.changes)

    def pending(self, next_step: int) -> list[dict]:
        return [{"step": at, "weights": w} for at, w in self.changes if at >= next_step]

    def state_dict(self) -> list:
        return [[at, w] for at, w in self.changes]

    def load_state_dict(self, state: list) -> None:
        self.changes = [(int(at), {k: float(v) for k, v in w.items()}) for at, w in state]


def checked_weights(weights: dict, sources: list[str]) -> dict[str, float]:
    """The weights an operator named (``overlord mix``), checked: known sources, numbers >= 0."""
    unknown = sorted(set(weights) - set(sources))
    if unknown:
        raise ValueError(f"mix: unknown source {unknown[0]!r} (sources of this run: {', '.join(sources)})")
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 for v in weights.values()) \
            or not weights:
        raise ValueError(f"mix: weights must be numbers >= 0, one per named source, got {weights}")
    return {s: float(v) for s, v in weights.items()}


def mixed_weights(named: dict[str, float], in_force: dict[str, float], sources: list[str], *,
                  only: bool) -> dict[str, float]:
    """The weights in force after an edit of ``named``: a source not named keeps its weight in ``in_force``
    (``only``: weighs 0). Refused when every source would weigh 0."""
    weights = {s: named.get(s, 0.0 if only else float(in_force.get(s, 0.0))) for s in sources}
    if sum(weights.values()) <= 0:
        raise ValueError(f"mix: every source would weigh 0 ({format_weights(weights)}): give one a positive weight")
    return weights


def format_weights(weights: dict[str, float]) -> str:
    """``name=w ...`` with each source's share of the sum: what the mixer draws (weights are relative)."""
    total = sum(weights.values())
    return " ".join(f"{s}={w:g} ({w / total:.0%})" if total > 0 else f"{s}={w:g}" for s, w in weights.items())


def source_fingerprint(source, validated: ValidatedCatalogs | None = None) -> str:
    """A digest of a source's files as their footers (or indexes) describe them (its catalog's fingerprint;
    ``validated``: the start's ``ValidatedCatalogs``, see ``load_catalog``)."""
    from ..source_catalog import load_catalog
    return load_catalog(source, validated).fingerprint()


def check_sources(cfg: Config, *, resume: bool, validated: ValidatedCatalogs | None = None) -> list[str]:
    """Before any role starts: remember each source's files (the first time it is seen in the run).
    On a resume, refuse what cannot be honoured (a continuing or
    re-added source whose files changed under the same name) with an error naming the source and what
    to do; make way for a source whose loader count changed (its loader journals number positions by
    the old count: moved aside, they only decide what stays buffered). ``validated``: the start's
    ``ValidatedCatalogs``, which records every source's catalog. Returns what it did, said in lines."""
    from ..journal import write_json_atomic
    path = cfg.run_dir / CATALOGS
    known = json.loads(path.read_text()) if resume and path.exists() else {}
    fingerprints = {source.name: source_fingerprint(source, validated) for source in cfg.sources}
    for source in cfg.sources:
        if source.name in known and fingerprints[source.name] != known[source.name]:
            raise ConfigError(f"sources.{source.name}: its files changed since the run planned from them (other "
                              f"files, or other row groups under the same names), so its cursor no longer points "
                              f"into them: restore the files, or give the new files another source name (it starts "
                              f"at epoch 0)")
    write_json_atomic(path, {**fingerprints, **known})  # a dropped source's stays, for its re-adding
    said: list[str] = []
    legacy = not (cfg.run_dir / MIXTURE).exists()  # a run started before mixtures were recorded: windows of 1
    if not resume or (legacy and not (cfg.run_dir / "plan-journal.jsonl").exists()):
        return said
    old = {} if legacy else json.loads((cfg.run_dir / MIXTURE).read_text()).get("sources", {})
    for source in cfg.sources:
        window = old.get(source.name, {}).get("shuffle_window", 1)
        if (legacy or source.name in old) and window != source.shuffle_window:
            raise ConfigError(f"sources.{source.name}.shuffle_window: {window} when the run started, "
                              f"{source.shuffle_window} "
                              f"now; the source's cursor counts windows of {window} row groups: keep {window} (or give "
                              f"the source another name, which starts it at epoch 0)")
    for source in cfg.sources:
        before = old.get(source.name, {}).get("loaders")
        if before is None or before == source.loaders:
            continue
        if cfg.loader.scaling.enabled:
            raise ConfigError(f"sources.{source.name}.loaders: changed from {before} to {source.loaders} at resume, "
                              f"but loader.scaling is on (its reshards are journaled per actor): keep {before}, or "
                              f"turn loader.scaling off for the resumed run")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for journal in sorted((cfg.run_dir / "loaders").glob(f"{source.name}-*")):
            if re.fullmatch(rf"{re.escape(source.name)}-\d+", journal.name):
                shutil.move(str(journal), str(journal.with_name(f"{journal.name}.old-{stamp}")))
        said.append(f"source {source.name}: {before} -> {source.loaders} loaders (its loader journals moved aside)")
    return said
