"""examples/ run as a user runs them, with torchrun on CPU (gloo) against a real cluster.

train_ddp.py, two failures in one run: killed mid-run (a rank SIGKILLs itself after step 4, the
whole data cluster is killed -9 too), then resumed from its checkpoint with ``--resume`` of the
cluster; later killed alone (a rank SIGKILLs itself after step 20, torchrun ends the other) and
started again from its checkpoint 10 steps old against the data cluster that kept running. Every
step's loss (the exact float), every step's sample keys and the final weights are those of an
undisturbed run.
cp_thd.py: the loss of context-parallel THD shares equals the loss of the whole sequences.
"""
from __future__ import annotations

import os
import re
import signal

import pytest

from flight_overlord.deploy.launch import LocalCluster

from ..helpers import run_example, write_config

SMALL = {"context_length": 512, "microbatches": 2, "tokens_per_step": 1800}  # the examples compute on 2 cores
STEPS, CRASH_AFTER = 22, 4  # then a crash after step 20, its checkpoint of step 10 being 10 steps old
ALONE_CRASH_AFTER, CHECKPOINT_EVERY = 20, 11
STEP_LINE = re.compile(r"^step (\d+) loss \S+ exact (\S+) keys (\S+)$", re.M)


def _torchrun(planner: str, script: str, *args: str, expect_ok: bool = True) -> str:
    return run_example(planner, script, *args, expect_ok=expect_ok)


def _steps(stdout: str) -> dict[int, tuple[str, str]]:
    return {int(step): (exact, keys) for step, exact, keys in STEP_LINE.findall(stdout)}


def _weights(stdout: str) -> str:
    (digest,) = re.findall(r"^weights (\w+)$", stdout, re.M)
    return digest


def test_ddp_example_killed_and_restarted_twice_is_bit_identical_to_an_undisturbed_run(corpus, tmp_path):
    train = ["--steps", str(STEPS)]
    undisturbed_config = write_config(tmp_path / "undisturbed", corpus, global_batch=SMALL)
    with LocalCluster(undisturbed_config) as cluster:
        undisturbed = _torchrun(cluster.planner, "train_ddp.py", *train, "--checkpoint-dir", str(tmp_path / "ckpt-u"))

    config = write_config(tmp_path / "disturbed", corpus, global_batch=SMALL)
    checkpoints = ["--checkpoint-dir", str(tmp_path / "ckpt-d")]
    cluster = LocalCluster(config, supervise=False)
    try:
        cluster.start()
        crashed = _torchrun(cluster.planner, "train_ddp.py", *train, *checkpoints, "--checkpoint-every", "2",
                            "--crash-after-step", str(CRASH_AFTER), expect_ok=False)
        for pid in cluster.pids():  # the whole job goes down: every role too
            os.kill(pid, signal.SIGKILL)
    finally:
        cluster.stop()
    every = ["--checkpoint-every", str(CHECKPOINT_EVERY)]  # a checkpoint after step 10 (and 21)
    with LocalCluster(config, mode="resume") as cluster:
        resumed = _torchrun(cluster.planner, "train_ddp.py", *train, *checkpoints, *every,
                            "--crash-after-step", str(ALONE_CRASH_AFTER), expect_ok=False)
        # the trainers alone: restarted from the checkpoint of step 10 against the data plane still up
        restarted = _torchrun(cluster.planner, "train_ddp.py", *train, *checkpoints, *every)

    expected = _steps(undisturbed)
    assert sorted(expected) == list(range(STEPS))
    first, second, third = _steps(crashed), _steps(resumed), _steps(restarted)
    assert sorted(first) == list(range(CRASH_AFTER + 1)) and "weights" not in crashed
    assert "resumed after step 3" in resumed and sorted(second) == list(range(CRASH_AFTER, ALONE_CRASH_AFTER + 1))
    assert "weights" not in resumed
    assert "resumed after step 10" in restarted and sorted(third) == list(range(CHECKPOINT_EVERY, STEPS))
    assert {**first, **second, **third} == expected
    assert first[CRASH_AFTER] == second[CRASH_AFTER]  # served again after each failure: the same
    assert all(second[s] == third[s] for s in range(CHECKPOINT_EVERY, ALONE_CRASH_AFTER + 1))
    assert _weights(restarted) == _weights(undisturbed)


def test_cp_example_loss_of_thd_shares_equals_the_whole_sequence_loss(corpus, tmp_path):
    config = write_config(tmp_path, corpus, mesh={"dp": 1, "cp": 2}, global_batch=SMALL)
    with LocalCluster(config) as cluster:
        out = _torchrun(cluster.planner, "cp_thd.py", "--steps", "2")
    lines = re.findall(r"^step (\d+): cp loss (\S+) no-cp loss (\S+)$", out, re.M)
    assert [int(s) for s, _, _ in lines] == [0, 1]
    for _, cp, whole in lines:
        assert float(cp) == pytest.approx(float(whole), rel=1e-5) and float(whole) > 0

