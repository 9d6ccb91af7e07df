"""Public import path of the balancing library (``flight_overlord.core.balance``): its public names
(``__all__`` is the library's, but the internal ``partition_each``), ``METHODS`` read through."""
from .core import balance as _balance
from .core.balance import CapacityError, PartitionStats, lower_bound, partition, partition_stats, register_balancer  # noqa: F401

__all__ = [name for name in _balance.__all__ if name != "partition_each"]


def __getattr__(name: str):
    if name == "METHODS":  # read through, so balancers registered later show up here too
        return _balance.METHODS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
