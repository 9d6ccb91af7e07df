"""A start builds each source's catalog once; a second start of the corpus (a new run, and a resume)
reuses it, unchanged, and gives the same stream; what a start writes names the catalogs by digest.
An audit re-derives the run's plans from the catalogs the run journaled. A Planner on a host without
the data gets the catalogs from its loaders."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.flight as fl

from flight_overlord import wire
from flight_overlord.config import load_config
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.deploy.topology import roles
from flight_overlord.harness import plan_hash
from flight_overlord.source_catalog import CATALOG_DIR_ENV, list_key
from flight_overlord.wire.security import SECRET_ENV

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


class HandStartedRun:
    """Roles started one by one with ``overlord serve``, each with its own config copy and catalog cache, as
    on several hosts: the Planner first, then the others with its address. Stopped on exit."""

    def __init__(self, folder, secret: str):
        self.folder, self.secret, self.processes = folder, secret, []

    def serve(self, role: str, config, catalogs, *flags: str, timeout: float = 60) -> str:
        """Start one role process and wait for its ready file: its address."""
        ready = self.folder / f"ready-{len(self.processes)}"
        log = open(self.folder / f"{role}-{len(self.processes)}.log", "w")
        env = {**os.environ, SECRET_ENV: self.secret, CATALOG_DIR_ENV: str(catalogs)}
        self.processes.append(subprocess.Popen(
            [sys.executable, "-m", "flight_overlord.deploy.cli", "serve", role, "--config", str(config),
             "--ready-file", str(ready), *flags], stdout=log, stderr=subprocess.STDOUT, env=env))
        log.close()
        deadline = time.monotonic() + timeout
        while not ready.exists():
            assert self.processes[-1].poll() is None and time.monotonic() < deadline, \
                (self.folder / f"{role}-{len(self.processes) - 1}.log").read_text()[-3000:]
            time.sleep(0.05)
        return ready.read_text()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for process in reversed(self.processes):
            process.terminate()
        for process in reversed(self.processes):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_a_planner_that_cannot_see_the_data_gets_the_catalogs_from_its_loaders(corpus, tmp_path):
    """A Planner (and constructors) on a host that neither sees the data nor shares the loaders' catalog
    cache: each source's catalog comes from the loader that registers with it, checked and cached on the
    Planner's host. After a kill -9 of the Planner, its cache emptied, the restarted Planner (--recover) gets
    them from the loaders it had registered. Every rank's stream is the one of a run where every role sees
    the data, and so is the audit."""
    with LocalCluster(write_config(tmp_path / "reference", corpus)) as cluster:
        reference = train(cluster.planner, 0, STEPS)
        reference_audit = audit(cluster.planner)

    loaders_config = write_config(tmp_path / "hosts", corpus)
    cfg = load_config(loaders_config)
    elsewhere = tmp_path / "no-data-host"  # the Planner's copy: the same run, a data_root that does not exist here
    blind_config = write_config(elsewhere, elsewhere / "no-such-data", run_dir=str(cfg.run_dir))
    planner_catalogs, loader_catalogs = tmp_path / "planner-catalogs", tmp_path / "loader-catalogs"
    cut = STEPS // 2
    with HandStartedRun(tmp_path, "catalog-test-secret-0123456789") as run:
        planner = run.serve("planner", blind_config, planner_catalogs)
        for spec in roles(cfg, standbys=False)[1:]:
            config = loaders_config if spec.role == "loader" else blind_config
            run.serve(spec.role, config, loader_catalogs, "--planner", planner, *spec.args)
        streams = train(planner, 0, cut)
        digests = {loader[0]: loader[4] for loader in
                   json.loads((cfg.run_dir / "planner" / "registry.json").read_text())["loaders"]}
        assert {p.name for p in planner_catalogs.iterdir()} == {f"{d}.arrow" for d in digests.values()}

        run.processes[0].kill()  # kill -9 of the Planner; its host's cache lost with it
        run.processes[0].wait()
        shutil.rmtree(planner_catalogs)
        run.serve("planner", blind_config, planner_catalogs, "--recover", "--port", planner.rsplit(":", 1)[1])
        resumed = train(planner, cut, STEPS)
        delivered = audit(planner)
    assert {rank: streams[rank] + resumed[rank] for rank in streams} == reference
    assert delivered == reference_audit and delivered["samples"] > 0 and delivered["duplicates"] == 0
    assert set(digests) == {s.name for s in cfg.sources}
    assert {p.name for p in planner_catalogs.iterdir()} == {f"{d}.arrow" for d in digests.values()}
    for digest in digests.values():  # kept as the loaders' hosts cached it
        assert cached(planner_catalogs, digest).equals(cached(loader_catalogs, digest))


def audit(planner: str) -> dict:
    """``overlord audit ADDRESS``'s figures (an inspection call: open)."""
    client = fl.connect(planner)
    try:
        report = wire.call(client, "audit", {}, timeout=120)
    finally:
        client.close()
    return {k: report[k] for k in ("samples", "duplicates", "missing", "per_source")}


def cached(folder, digest: str) -> pa.Table:
    return pa.ipc.open_file(str(folder / f"{digest}.arrow")).read_all()
