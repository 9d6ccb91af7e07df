"""flight_overlord: a disaggregated multi-source data loader on Apache Arrow Flight (OVERLORD).

Trainers import :class:`TrainerClient`; everything else runs as Flight servers
(``overlord up CONFIG`` or ``overlord serve ROLE``).
"""
from .errors import ConfigError

__all__ = ["ComputeTimer", "Config", "ConfigError", "MicrobatchView", "TrainerClient", "load_config"]


def __getattr__(name: str):
    """The public names on first use, so that importing a submodule loads only what it needs: a
    trainer's client does without the config parser (image decoders, Parquet, file systems: ~6 MiB
    of private memory per rank), and ``overlord`` chooses Arrow's allocator before pyarrow loads
    (flight_overlord/allocator.py)."""
    if name in ("ComputeTimer", "MicrobatchView", "TrainerClient"):
        from . import client
        return getattr(client, name)
    if name in ("Config", "load_config"):
        from . import config
        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
