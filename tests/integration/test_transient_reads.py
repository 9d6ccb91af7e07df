"""A row group that cannot be read for a while: a read that failed only before a kill -9 of the Planner
holds for no journaled step. The restarted Planner plans those steps again from a good read, every
rank's stream is the undisturbed run's, and every journaled step re-derives (the audit passes)."""
from __future__ import annotations

import json
import shutil
import signal
import threading
import time

import pyarrow.parquet as pq

from flight_overlord.config import load_config
from flight_overlord.core.order import epoch_order, owned_row_groups
from flight_overlord.deploy import cli
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.loader.row_groups import read_catalog
from flight_overlord.planner.audit import offline_audit

from ..helpers import WEIGHTS
from .test_recovery import config, train

STEPS, MIX_AT = 8, 4
MIXED = {**WEIGHTS, "captions": 0.3}  # from MIX_AT on; captions is not drawn before


def captions_late(directory, data):
    """test_recovery's config (captions in 2 loader actors) with captions at weight 0 until a live
    mix at MIX_AT: its first row groups are fetched when step MIX_AT is planned, not at the start."""
    sources = [{"name": n, "paths": f"{n}/*.parquet", "weight": 0.0 if n == "captions" else w,
                "loaders": 2 if n == "captions" else 1} for n, w in WEIGHTS.items()]
    return config(directory, data, sources=sources)


def run(path, fault=None) -> dict[int, list]:
    """Every rank's stream of STEPS steps, the mix set at MIX_AT; ``fault(cluster)`` before trainers start."""
    with LocalCluster(path) as cluster:
        cli.main(["mix", cluster.planner, "--config", str(path), "--at", str(MIX_AT),
                  "--set", ",".join(f"{k}={v}" for k, v in MIXED.items())])
        done = fault(cluster) if fault is not None else None
        streams = train(cluster.planner, 0, STEPS)
        if done is not None:
            done()
    return streams


def test_a_read_that_failed_before_a_planner_kill_holds_for_no_journaled_step(corpus, tmp_path):
    undisturbed = run(captions_late(tmp_path / "undisturbed", corpus))
    data = tmp_path / "data"
    shutil.copytree(corpus, data)
    path = captions_late(tmp_path / "run", data)
    cfg = load_config(path)
    catalog = read_catalog(cfg.source("captions"))
    first, second = epoch_order(catalog, seed=cfg.seed, source="captions", epoch=0)[:2]
    actor = {rg: a for a in range(2) for rg in owned_row_groups(catalog, a, 2)}
    assert cfg.source("captions").shuffle_window >= 2 and actor[first] != actor[second]  # read in one window
    # The window's first row group unreadable (its data pages, the footer intact), the actor owning the
    # second one stopped: planning MIX_AT notes the failed read, then waits on that actor. The Planner
    # gets kill -9 there, before MIX_AT is journaled; the file comes back, the actor goes on.
    broken = data / first.file
    intact = broken.read_bytes()
    column = pq.read_metadata(broken).row_group(first.row_group).column(0)
    raw = bytearray(intact)
    start = column.dictionary_page_offset or column.data_page_offset
    raw[start + 8:start + column.total_compressed_size - 8] = b"\xff" * (column.total_compressed_size - 16)
    broken.write_bytes(bytes(raw))
    notes = cfg.run_dir / "planner" / "unreadable.json"
    noted, journaled_at_kill = [], []

    def fault(cluster):
        stopped = f"loader-captions-{actor[second]}"
        cluster.kill(stopped, signal.SIGSTOP)

        def kill_when_noted():
            try:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and not (notes.exists() and json.loads(notes.read_text())):
                    time.sleep(0.01)
                noted.extend(json.loads(notes.read_text()) if notes.exists() else [])
                journal = cfg.run_dir / "plan-journal.jsonl"
                journaled_at_kill.append(sum('"digest"' in line for line in journal.open()))
                cluster.kill("planner")
            finally:
                broken.write_bytes(intact)
                cluster.kill(stopped, signal.SIGCONT)
        killer = threading.Thread(target=kill_when_noted, daemon=True)
        killer.start()

        def done():
            killer.join(timeout=60)
            cluster.wait_restarted("planner")
        return done

    streams = run(path, fault)
    assert [note[:4] for note in noted] == [["captions", 0, first.file, first.row_group]]
    assert journaled_at_kill == [MIX_AT], "the Planner was killed before the step that read it was journaled"
    assert streams == undisturbed
    report = offline_audit(cfg.run_dir)  # every journaled step re-derived and checked against its digest
    delivered = sum(len(mb) for stream in undisturbed.values() for _, (mbs, _) in stream for mb in mbs)
    assert (report["samples"], report["duplicates"], report["missing"]) == (delivered, 0, 0)
    assert json.loads(notes.read_text()) == []  # read again after the restart: the failure held for no record
    assert any(k.startswith(f"captions:{first.file}:{first.row_group}:")
               for stream in streams.values() for _, (mbs, _) in stream for mb in mbs for k in mb)
