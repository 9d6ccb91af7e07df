"""The TorchTitan and Megatron-Core examples on CPU (torchrun, 2 gloo ranks), each killed -9 after a step's
checkpoint and resumed from its framework's own checkpoint against the data plane that kept running:
every rank's per-step losses (exact floats) and final weights equal an undisturbed run's."""
from __future__ import annotations

import re

import pytest

from flight_overlord.deploy.launch import LocalCluster

from ..helpers import run_example, write_config

BATCH = {"context_length": 256, "microbatches": 2, "tokens_per_step": 800}
STEPS, CRASH_AFTER = 4, 1
LOSS_LINE = re.compile(r"rank (\d+) step (\d+) loss (-?0x[0-9a-f.]+p[+-]\d+)")
WEIGHTS_LINE = re.compile(r"^rank (\d+) weights (\w+)$", re.M)
TP_READS_ONLY_ON_RANK_0 = 'def build(s):\n    return s.broadcast_at("TP", others_read=False)\n'


def _losses(out: str) -> dict[tuple[int, int], str]:
    return {(int(r), int(s)): loss for r, s, loss in LOSS_LINE.findall(out)}


def _crashed_and_resumed_equals_undisturbed(tmp_path, corpus, script: str, **config) -> None:
    def train(planner: str, checkpoint: str, *extra: str, expect_ok: bool = True) -> str:
        return run_example(planner, script, "--microbatches", str(BATCH["microbatches"]), "--steps", str(STEPS),
                           "--checkpoint-dir", checkpoint, *extra, expect_ok=expect_ok)

    with LocalCluster(write_config(tmp_path / "undisturbed", corpus, global_batch=BATCH, **config)) as cluster:
        undisturbed = train(cluster.planner, str(tmp_path / "ckpt-u"))
    with LocalCluster(write_config(tmp_path / "crashed", corpus, global_batch=BATCH, **config)) as cluster:
        crashed = train(cluster.planner, str(tmp_path / "ckpt-d"), "--crash-after-step", str(CRASH_AFTER),
                        expect_ok=False)
        resumed = train(cluster.planner, str(tmp_path / "ckpt-d"))
    expected, before, after = _losses(undisturbed), _losses(crashed), _losses(resumed)
    assert sorted(expected) == [(r, s) for r in (0, 1) for s in range(STEPS)]
    assert sorted(before) == [(r, s) for r in (0, 1) for s in range(CRASH_AFTER + 1)]
    assert sorted(after) == [(r, s) for r in (0, 1) for s in range(CRASH_AFTER + 1, STEPS)]
    assert {**before, **after} == expected
    assert len(set(expected.values())) > 1  # the steps trained on different data
    assert sorted(WEIGHTS_LINE.findall(resumed)) == sorted(WEIGHTS_LINE.findall(undisturbed)) != []


def test_torchtitan_example_resumed_by_its_checkpoint_manager_equals_an_undisturbed_run(corpus, tmp_path):
    pytest.importorskip("flight_overlord.integrations.torchtitan", reason="torchtitan not installed")
    _crashed_and_resumed_equals_undisturbed(tmp_path, corpus, "train_torchtitan.py")


@pytest.mark.slow  # 34 s on 2 shared cores: with the TorchTitan one (27 s), over the default suite's budget
def test_megatron_example_read_on_tp_rank_0_and_resumed_at_its_iteration_equals_an_undisturbed_run(
        corpus, tmp_path):
    pytest.importorskip("megatron.core", reason="megatron-core not installed")
    for run in ("undisturbed", "crashed"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "tp.py").write_text(TP_READS_ONLY_ON_RANK_0)
    _crashed_and_resumed_equals_undisturbed(tmp_path, corpus, "train_megatron.py", mesh={"dp": 1, "tp": 2},
                                            strategy="tp.py")
