"""The TorchTitan and Megatron-Core examples on CPU (gloo, 2 ranks), each trained, stopped and resumed
from its framework's own checkpoint against the running data plane: every rank's per-step losses (exact
floats) equal an undisturbed run's."""
from __future__ import annotations

import re

import pytest

from flight_overlord.deploy.launch import LocalCluster

from ..helpers import run_example, write_config

BATCH = {"context_length": 256, "microbatches": 2, "tokens_per_step": 800}
STEPS, STOP_AFTER = 4, 2
LOSS_LINE = re.compile(r"rank (\d+) step (\d+) loss (-?0x[0-9a-f.]+p[+-]\d+)")
TP_READS_ONLY_ON_RANK_0 = 'def build(s):\n    return s.broadcast_at("TP", others_read=False)\n'


def _losses(out: str) -> dict[tuple[int, int], str]:
    return {(int(r), int(s)): loss for r, s, loss in LOSS_LINE.findall(out)}


def _stopped_and_resumed_equals_undisturbed(tmp_path, corpus, script: str, ranks: list[int], **config) -> None:
    def train(planner: str, checkpoint: str, *extra: str) -> dict:
        return _losses(run_example(planner, script, "--microbatches", str(BATCH["microbatches"]),
                                   "--steps", str(STEPS), "--checkpoint-dir", checkpoint, *extra))

    with LocalCluster(write_config(tmp_path / "undisturbed", corpus, global_batch=BATCH, **config)) as cluster:
        expected = train(cluster.planner, str(tmp_path / "ckpt-u"))
    with LocalCluster(write_config(tmp_path / "stopped", corpus, global_batch=BATCH, **config)) as cluster:
        before = train(cluster.planner, str(tmp_path / "ckpt-d"), "--stop-after", str(STOP_AFTER))
        after = train(cluster.planner, str(tmp_path / "ckpt-d"))
    assert sorted(expected) == [(r, s) for r in ranks for s in range(STEPS)]
    assert sorted(before) == [(r, s) for r in ranks for s in range(STOP_AFTER)]
    assert sorted(after) == [(r, s) for r in ranks for s in range(STOP_AFTER, STEPS)]
    assert {**before, **after} == expected
    assert len(set(expected.values())) > 1  # the steps trained on different data


@pytest.mark.slow  # two clusters and three torchruns: about 80 s on 2 shared cores
def test_torchtitan_example_resumed_by_its_checkpoint_manager_equals_an_undisturbed_run(corpus, tmp_path):
    pytest.importorskip("flight_overlord.integrations.torchtitan", reason="torchtitan not installed")
    _stopped_and_resumed_equals_undisturbed(tmp_path, corpus, "train_torchtitan.py", [0, 1])


@pytest.mark.slow  # two clusters and three torchruns of megatron-core: about 55 s on 2 shared cores
def test_megatron_example_read_on_tp_rank_0_and_resumed_at_its_iteration_equals_an_undisturbed_run(
        corpus, tmp_path):
    pytest.importorskip("megatron.core", reason="megatron-core not installed")
    (tmp_path / "undisturbed").mkdir()
    (tmp_path / "stopped").mkdir()
    for run in ("undisturbed", "stopped"):
        (tmp_path / run / "tp.py").write_text(TP_READS_ONLY_ON_RANK_0)
    _stopped_and_resumed_equals_undisturbed(tmp_path, corpus, "train_megatron.py", [0, 1],
                                            mesh={"dp": 1, "tp": 2}, strategy="tp.py")
