"""A 2-stage pipeline (torch.distributed.pipelining, GPipe, gloo, torchrun) trained from a pp=2 run:
the last stage's loss, from the labels it was delivered (its tokens never reach it), equals the loss
of the same model trained without pipelining on a pp=1 run of the same config and seed."""
from __future__ import annotations

import re

import pytest

from flight_overlord.deploy.launch import LocalCluster

from ..helpers import ONE_RANK_BATCH, run_example, write_config

pytest.importorskip("torch.distributed.pipelining")

STEPS = 3
LOSS_LINE = re.compile(r"^step (\d+) microbatch (\d+) loss (\S+)$", re.M)


def _losses(out: str) -> dict[tuple[int, int], float]:
    return {(int(s), int(m)): float.fromhex(x) for s, m, x in LOSS_LINE.findall(out)}


@pytest.mark.slow  # two runs and a torchrun: about 70 s on 2 shared cores
def test_last_stage_loss_from_its_delivered_labels_equals_the_unpipelined_loss(corpus, tmp_path):
    batch = {**ONE_RANK_BATCH, "context_length": 256, "tokens_per_step": 400}
    with LocalCluster(write_config(tmp_path / "pp2", corpus, mesh={"pp": 2, "dp": 1}, global_batch=batch)) as cluster:
        pipelined = _losses(run_example(cluster.planner, "train_pp.py", "--steps", str(STEPS)))
    with LocalCluster(write_config(tmp_path / "pp1", corpus, mesh={"dp": 1}, global_batch=batch)) as cluster:
        single = _losses(run_example(cluster.planner, "train_pp.py", "--single", "--steps", str(STEPS), nproc=None))
    assert sorted(pipelined) == [(s, m) for s in range(STEPS) for m in range(batch["microbatches"])]
    assert pipelined.keys() == single.keys()
    for key, loss in single.items():
        assert pipelined[key] == pytest.approx(loss, rel=1e-5, abs=1e-6), key
