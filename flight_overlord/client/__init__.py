from .. import allocator

allocator.system_pool_if_first_to_load_pyarrow()  # before anything of ours loads pyarrow

from .compute_timer import ComputeTimer
from .fetcher import StepFetcher
from .microbatches import MicrobatchView
from .trainer import TrainerClient, launcher_rank, table_to_microbatches

__all__ = ["ComputeTimer", "MicrobatchView", "StepFetcher", "TrainerClient", "launcher_rank", "table_to_microbatches"]
