"""The launcher's rank and world size, as TrainerClient.from_env reads them."""
from __future__ import annotations

import pytest
import torch

from flight_overlord.client import TrainerClient, launcher_rank


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, (3, 8)),                  # torchrun
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "16"}, (5, 16)),                          # srun
    ({"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "7", "SLURM_NTASKS": "9"}, (0, 2)),  # torchrun under Slurm
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, (1, 2)),
])
def test_launcher_rank(env, expected):
    assert launcher_rank(env) == expected


@pytest.mark.parametrize("env, message", [
    ({}, "no launcher rank in the environment: set one of RANK/WORLD_SIZE"),
    ({"RANK": "1"}, "RANK is set but WORLD_SIZE is not"),
    ({"RANK": "one", "WORLD_SIZE": "2"}, "must be integers"),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "4"}, r"SLURM_PROCID=4 is not in \[0, SLURM_NTASKS=4\)"),
])
def test_a_bad_launcher_environment_is_named(env, message):
    with pytest.raises(ValueError, match=message):
        launcher_rank(env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="pinned memory works with an accelerator")
def test_pin_memory_without_an_accelerator_is_a_clear_error():
    with pytest.raises(ValueError, match="pin_memory=True needs an accelerator"):
        TrainerClient("grpc://127.0.0.1:1", 0, pin_memory=True)
