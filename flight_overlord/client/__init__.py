from .compute_timer import ComputeTimer
from .trainer import StepFetcher, TrainerClient, launcher_rank, table_to_microbatches

__all__ = ["ComputeTimer", "StepFetcher", "TrainerClient", "launcher_rank", "table_to_microbatches"]
