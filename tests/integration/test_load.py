"""Load: 64 concurrent trainer clients (a dp=64 mesh served by 4 constructors) for a bounded time.

The same driver as ``benchmarks.control_plane.load`` (``run_load``): one fetching thread per rank, then every
rank catches up to the furthest step and the delivered keys are compared with the journal's plans,
step by step. No fetch may fail, every planned sample arrives exactly once, no role restarts, and
the role processes' PSS after the warm-up and at the end stay close (the benchmark's goal is 10%;
a short run on a shared machine gets a generous bound).
"""
from __future__ import annotations

import pytest

from benchmarks.control_plane import load as bench
from flight_overlord.deploy.launch import LocalCluster

from ..helpers import write_config


def _load(corpus, tmp_path, *, seconds: float, warmup: float):
    config = write_config(tmp_path, corpus, **bench.CONFIG)
    with LocalCluster(config) as cluster:
        assert cluster.cfg.mesh.world_size == 64 and cluster.cfg.num_constructors == 4
        result = bench.run_load(cluster, lambda: bench.plan_records(config), seconds=seconds, warmup=warmup)
    print("\n".join(result.lines()))
    return result


def _check(result, *, pss_bound: float, min_steps: int) -> None:
    assert not result.errors, result.errors[:3]
    assert not result.restarts, result.restarts
    assert result.exactly_once, (result.duplicates, result.missing, result.steps_checked)
    assert result.global_steps >= min_steps, f"only {result.global_steps} steps in {result.seconds:.0f} s"
    assert abs(result.pss_growth) <= pss_bound, f"role PSS grew {100 * result.pss_growth:+.1f}%"


def test_64_trainers_for_15_seconds(corpus, tmp_path):
    _check(_load(corpus, tmp_path, seconds=15, warmup=5), pss_bound=0.5, min_steps=5)


@pytest.mark.slow
def test_64_trainers_for_120_seconds(corpus, tmp_path):
    _check(_load(corpus, tmp_path, seconds=120, warmup=10), pss_bound=0.2, min_steps=60)
