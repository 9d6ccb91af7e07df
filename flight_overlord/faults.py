"""Fault injection for tests and benchmarks, installed through a run config's ``plugins:`` (so every
process of the run has it) and imported by no production module: the roles read no switch for it.

``slow_sources(run_dir, {"captions": 0.4})`` makes the loader actors of that run's ``captions`` source
sleep that long in each samples call, inside the seconds they report as ``serve_seconds``, so the
starvation view charges the wait to that source. ``slow_sources_plugin`` writes the plugin file a
config names; the run directory keeps the delay to that run's actors in a process that loads other
configs too (a test session)."""
from __future__ import annotations

import functools
import json
import time
from pathlib import Path

from .loader.actor import LoaderActor

_delays: dict[tuple[Path, str], float] = {}  # (run dir, source) -> seconds per samples call


def slow_sources(run_dir: str | Path, delays: dict[str, float]) -> None:
    """The named sources' loader actors of the run in ``run_dir`` sleep ``delays[source]`` seconds per
    samples call, in this process."""
    run_dir = Path(run_dir).resolve()
    for source, seconds in delays.items():
        if not isinstance(seconds, (int, float)) or seconds < 0:
            raise ValueError(f"slow_sources: {source}={seconds!r} is not a number of seconds >= 0")
        _delays[(run_dir, source)] = float(seconds)
    if not getattr(LoaderActor.pick, "slowed", False):
        LoaderActor.pick = _slowed(LoaderActor.pick)


def _slowed(pick):
    @functools.wraps(pick)
    def slowed_pick(actor: LoaderActor, *args, **kwargs):
        delay = _delays.get((actor.run_dir.resolve(), actor.share.source.name))
        if delay:
            time.sleep(delay)
        return pick(actor, *args, **kwargs)
    slowed_pick.slowed = True
    return slowed_pick


def slow_sources_plugin(directory: Path, run_dir: Path, delays: dict[str, float]) -> Path:
    """A plugin file in ``directory`` that slows ``delays``' sources of the run in ``run_dir``; name it
    in the config's ``plugins:``."""
    path = Path(directory) / "slow_sources.py"
    path.write_text("from flight_overlord.faults import slow_sources\n\n"
                    f"slow_sources({str(Path(run_dir))!r}, {json.dumps(delays)})\n")
    return path
