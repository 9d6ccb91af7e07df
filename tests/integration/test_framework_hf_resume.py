"""The HF adapter under torchrun (2 gloo ranks). transformers' Trainer: the trainers killed -9 after a
checkpoint and the data plane killed -9 too, then resumed from the trainers' checkpoint: every rank's
per-step losses (exact floats) and the final weights equal an undisturbed run's. A plain accelerate
loop: stopped and resumed from its saved state, the same losses as an undisturbed run."""
from __future__ import annotations

import os
import re
import signal

import pytest

from flight_overlord.deploy.launch import LocalCluster

from ..helpers import run_example, write_config

pytest.importorskip("transformers")

BATCH = {"context_length": 256, "microbatches": 2, "tokens_per_step": 800}
STEPS, CRASH_AFTER = 4, 1
LOSS_LINE = re.compile(r"rank (\d+) step (\d+) loss (-?0x[0-9a-f.]+p[+-]\d+)")  # wherever Trainer's logs put it
WEIGHTS_LINE = re.compile(r"^weights (\S+)$", re.M)


def _losses(out: str) -> dict[tuple[int, int], str]:
    return {(int(r), int(s)): loss for r, s, loss in LOSS_LINE.findall(out)}


def _train(planner: str, output: str, *extra: str, expect_ok: bool = True) -> str:
    return run_example(planner, "train_hf.py", "--microbatches", str(BATCH["microbatches"]), "--steps", str(STEPS),
                       "--output-dir", output, *extra, expect_ok=expect_ok)


@pytest.mark.slow  # three runs and three torchruns: about 90 s on 2 shared cores
def test_hf_trainer_killed_and_resumed_is_bit_identical_to_an_undisturbed_run(corpus, tmp_path):
    with LocalCluster(write_config(tmp_path / "undisturbed", corpus, global_batch=BATCH)) as cluster:
        undisturbed = _train(cluster.planner, str(tmp_path / "out-u"))

    config = write_config(tmp_path / "disturbed", corpus, global_batch=BATCH)
    output = tmp_path / "out-d"
    cluster = LocalCluster(config, supervise=False)
    try:
        cluster.start()
        crashed = _train(cluster.planner, str(output), "--crash-after-step", str(CRASH_AFTER), expect_ok=False)
        for pid in cluster.pids():  # the data plane goes down with the trainers
            os.kill(pid, signal.SIGKILL)
    finally:
        cluster.stop()
    with LocalCluster(config, mode="resume") as cluster:
        resumed = _train(cluster.planner, str(output), "--resume", str(output / f"checkpoint-{CRASH_AFTER + 1}"))

    expected = _losses(undisturbed)
    assert sorted(expected) == [(r, s) for r in range(2) for s in range(STEPS)]
    before, after = _losses(crashed), _losses(resumed)
    assert sorted(before) == [(r, s) for r in range(2) for s in range(CRASH_AFTER + 1)]
    assert sorted(after) == [(r, s) for r in range(2) for s in range(CRASH_AFTER + 1, STEPS)]
    assert {**before, **after} == expected
    assert WEIGHTS_LINE.findall(resumed) == WEIGHTS_LINE.findall(undisturbed) != []


@pytest.mark.slow  # two runs and three torchruns: about 100 s on 2 shared cores
def test_accelerate_loop_stopped_and_resumed_from_its_state_equals_an_undisturbed_run(corpus, tmp_path):
    """examples/train_accelerate.py: the loader outside accelerator.prepare, its position saved beside
    accelerate's state; stopped after 2 steps and resumed against the running data plane."""
    def train(planner: str, steps: int, checkpoint: str, *extra: str) -> dict:
        return _losses(run_example(planner, "train_accelerate.py", "--microbatches", str(BATCH["microbatches"]),
                                   "--steps", str(steps), "--checkpoint-dir", checkpoint, *extra))

    with LocalCluster(write_config(tmp_path / "undisturbed", corpus, global_batch=BATCH)) as cluster:
        expected = train(cluster.planner, STEPS, str(tmp_path / "ckpt-u"))
    with LocalCluster(write_config(tmp_path / "stopped", corpus, global_batch=BATCH)) as cluster:
        before = train(cluster.planner, 2, str(tmp_path / "ckpt-d"))
        after = train(cluster.planner, STEPS, str(tmp_path / "ckpt-d"), "--resume")
    assert sorted(expected) == [(r, s) for r in range(2) for s in range(STEPS)]
    assert sorted(before) == [(r, s) for r in range(2) for s in range(2)]
    assert {**before, **after} == expected and len(after) == 2 * (STEPS - 2)
