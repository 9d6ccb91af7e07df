from .compute_timer import ComputeTimer
from .fetcher import StepFetcher
from .microbatches import MicrobatchView
from .trainer import TrainerClient, launcher_rank, table_to_microbatches

__all__ = ["ComputeTimer", "MicrobatchView", "StepFetcher", "TrainerClient", "launcher_rank", "table_to_microbatches"]
