from .compute_timer import ComputeTimer
from .trainer import StepFetcher, TrainerClient, table_to_microbatches

__all__ = ["ComputeTimer", "StepFetcher", "TrainerClient", "table_to_microbatches"]
