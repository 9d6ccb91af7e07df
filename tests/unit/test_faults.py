"""The fault plugin (``flight_overlord/faults.py``): a config's ``plugins:`` entry that slows the named
sources' loader actors of one run, and no other actor (another run's, another source's)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flight_overlord import faults
from flight_overlord.config import load_config
from flight_overlord.loader.actor import LoaderActor
from flight_overlord.loader.row_groups import SourceShare


def _config(tmp_path, run: str, plugins: list[str]):
    for name in ("slow", "fast"):
        pq.write_table(pa.table({"text": [f"{name} {i}" for i in range(8)]}), tmp_path / f"{name}.parquet")
    path = tmp_path / f"{run}.yaml"
    path.write_text(f"run_dir: {tmp_path / run}\nplugins: {plugins}\n"
                    "sources: [{name: slow, paths: slow.parquet}, {name: fast, paths: fast.parquet}]\n"
                    "global_batch: {context_length: 64, microbatches: 1, samples_per_step: 2}\n")
    return load_config(path)


def test_the_plugin_slows_the_named_source_of_its_run_only(tmp_path, monkeypatch):
    slept = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    plugin = faults.slow_sources_plugin(tmp_path, tmp_path / "slowed", {"slow": 0.25})
    slowed, other = _config(tmp_path, "slowed", [str(plugin)]), _config(tmp_path, "other", [])
    actors = {(run, s.name): LoaderActor(SourceShare(s, 0, 64), seed=0, read_ahead=0, run_dir=cfg.run_dir)
              for run, cfg in (("slowed", slowed), ("other", other)) for s in cfg.sources}
    try:
        for (run, source), actor in sorted(actors.items()):
            rg = actor._at(0)
            before = len(slept)
            assert actor.samples(0, 0, [[0, rg.file, rg.row_group, 1]]).num_rows == 1
            assert slept[before:] == ([0.25] if (run, source) == ("slowed", "slow") else [])
    finally:
        for actor in actors.values():
            actor.close()


def test_a_delay_that_is_no_number_of_seconds_is_refused(tmp_path):
    with pytest.raises(ValueError, match="slow_sources: slow=-1 is not a number of seconds >= 0"):
        faults.slow_sources(tmp_path, {"slow": -1})
