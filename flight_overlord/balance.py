"""Public import path of the balancing library (``flight_overlord.core.balance``)."""
from .core.balance import METHODS, CapacityError, PartitionStats, lower_bound, partition, partition_stats

__all__ = ["METHODS", "CapacityError", "PartitionStats", "lower_bound", "partition", "partition_stats"]
