from .trainer import StepFetcher, TrainerClient, launcher_rank, table_to_microbatches

__all__ = ["StepFetcher", "TrainerClient", "launcher_rank", "table_to_microbatches"]
