"""A start builds each source's catalog once; a second start of the corpus (a new run, and a resume)
reuses it, unchanged, and gives the same stream; what a start writes names the catalogs by digest.
An audit re-derives the run's plans from the catalogs the run journaled."""
from __future__ import annotations

import json

from flight_overlord.config import load_config
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.harness import plan_hash
from flight_overlord.source_catalog import list_key

from ..helpers import train, write_config

STEPS = 4


def cached_files(folder) -> dict[str, tuple[int, int]]:
    """Every file of the catalog cache, with its inode and modification time (a rewrite changes them)."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_a_second_start_reuses_the_catalog_and_gives_the_same_stream(corpus, tmp_path, monkeypatch):
    catalogs = tmp_path / "catalogs"
    monkeypatch.setenv("OVERLORD_CATALOG_DIR", str(catalogs))  # this test's own cache, empty: the first start builds
    first_path = write_config(tmp_path / "first", corpus, checkpoint={"every": 2})
    cfg = load_config(first_path)
    with LocalCluster(first_path) as cluster:
        first = train(cluster.planner, 0, STEPS)
    built = cached_files(catalogs)
    assert {f"{list_key(s)}.json" for s in cfg.sources} <= set(built)  # one catalog per source
    digests = {s.name: json.loads((catalogs / f"{list_key(s)}.json").read_text())["digest"] for s in cfg.sources}
    assert {f"{d}.arrow" for d in digests.values()} <= set(built)

    # the run journals the catalogs by digest (a few bytes per source), not their row groups
    entry = json.loads((cfg.run_dir / "planner" / "configs.json").read_text())[-1]
    assert entry["catalogs"] == digests and "row_groups" not in entry
    registry = json.loads((cfg.run_dir / "planner" / "registry.json").read_text())
    assert {loader[0]: loader[4] for loader in registry["loaders"]} == digests

    second_path = write_config(tmp_path / "second", corpus, checkpoint={"every": 2})
    with LocalCluster(second_path) as cluster:
        second = train(cluster.planner, 0, STEPS)
    assert second == first
    assert cached_files(catalogs) == built  # reused as it was: nothing rebuilt or rewritten

    cut = STEPS // 2  # a resume of the second run continues its stream, the catalogs still untouched
    with LocalCluster(second_path, mode="resume") as cluster:
        resumed = train(cluster.planner, cut, STEPS)
    assert {r: second[r][:cut] + resumed[r] for r in second} == second
    assert cached_files(catalogs) == built
    # an offline audit re-derives every journaled plan from the catalogs the run names
    assert plan_hash(cfg.run_dir, STEPS) == plan_hash(load_config(second_path).run_dir, STEPS, root=None)
