from .trainer import StepFetcher, TrainerClient, table_to_microbatches

__all__ = ["StepFetcher", "TrainerClient", "table_to_microbatches"]
