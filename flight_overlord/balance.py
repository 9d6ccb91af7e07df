"""Public import path of the balancing library (``flight_overlord.core.balance``)."""
from .core import balance as _balance
from .core.balance import (
    CapacityError,
    PartitionStats,
    lower_bound,
    partition,
    partition_stats,
    register_balancer,
)

__all__ = [
    "METHODS",
    "CapacityError",
    "PartitionStats",
    "lower_bound",
    "partition",
    "partition_stats",
    "register_balancer",
]


def __getattr__(name: str):
    if name == "METHODS":  # read through, so balancers registered later show up here too
        return _balance.METHODS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
