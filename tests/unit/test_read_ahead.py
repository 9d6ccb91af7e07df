"""The read-ahead workers a loader process shares among its actors (``loader/read_ahead.py``): a few
threads for the process, and each actor reads ahead when its turn comes."""
from __future__ import annotations

import threading
import time

from flight_overlord.config import load_config
from flight_overlord.loader.actor import LoaderActor
from flight_overlord.loader.read_ahead import WORKERS, ReadAheadPool
from flight_overlord.loader.row_groups import SourceShare

from ..helpers import write_config


def _wait_for(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not condition():
        time.sleep(0.05)
    return condition()


def _actors(cfg, run_dir, pool=None) -> list[LoaderActor]:
    return [LoaderActor(SourceShare(s, 0, cfg.global_batch.context_length, cfg.vision), seed=cfg.seed,
                        read_ahead=1, run_dir=run_dir, replicated=False, pool=pool) for s in cfg.sources]


def test_the_actors_of_a_process_share_a_few_threads_and_each_reads_ahead(corpus, tmp_path):
    cfg = load_config(write_config(tmp_path, corpus))
    before = threading.active_count()
    pool = ReadAheadPool()
    actors = _actors(cfg, tmp_path / "run", pool)
    try:
        assert len(actors) == 6 and threading.active_count() - before == WORKERS + 1  # workers + the ticker
        assert _wait_for(lambda: all(0 in a._buffer for a in actors))  # start-up: every actor's first row group
        for actor in actors:  # the Planner asks for it: the actor reads on, each when its turn comes
            rg = actor._at(0)
            actor.metadata(0, rg.file, rg.row_group)
        at_once = [a for a in actors if a.read_ahead_at(1) == 0]
        assert at_once and _wait_for(lambda: all(1 in a._buffer for a in at_once))
    finally:
        for actor in actors:
            actor.close()
        pool.close()
