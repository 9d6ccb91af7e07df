"""What a launcher (torchrun, Slurm, Open MPI) tells a training process: its rank and the world size."""
from __future__ import annotations

import os

PLANNER_ENV = "OVERLORD_PLANNER"  # the Planner's address, for TrainerClient.from_env()
# (rank, world size) variables of the launchers from_env() knows, in the order they are tried
LAUNCHER_ENV = (("RANK", "WORLD_SIZE", "torchrun"), ("SLURM_PROCID", "SLURM_NTASKS", "Slurm"),
                ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"))


def launcher_rank(env: dict | None = None) -> tuple[int, int]:
    """(rank, world size) from the launcher's environment: torchrun's ``RANK`` / ``WORLD_SIZE``,
    else Slurm's ``SLURM_PROCID`` / ``SLURM_NTASKS``, else Open MPI's; an error names what is missing."""
    env = os.environ if env is None else env
    for rank_var, size_var, launcher in LAUNCHER_ENV:
        if rank_var in env:
            try:
                rank, size = int(env[rank_var]), int(env[size_var])
            except KeyError:
                raise ValueError(f"{rank_var} is set but {size_var} is not ({launcher})") from None
            except ValueError:
                raise ValueError(f"{rank_var}={env[rank_var]!r} and {size_var}={env.get(size_var)!r} must be "
                                 f"integers ({launcher})") from None
            if not 0 <= rank < size:
                raise ValueError(f"{rank_var}={rank} is not in [0, {size_var}={size}) ({launcher})")
            return rank, size
    names = ", ".join(f"{r}/{s} ({launcher})" for r, s, launcher in LAUNCHER_ENV)
    raise ValueError(f"no launcher rank in the environment: set one of {names}")
