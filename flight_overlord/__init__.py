"""flight_overlord: a disaggregated multi-source data loader on Apache Arrow Flight (OVERLORD).

Trainers import :class:`TrainerClient`; everything else runs as Flight servers
(``overlord up CONFIG`` or ``overlord serve ROLE``).
"""
from .client import ComputeTimer, TrainerClient
from .config import Config, ConfigError, load_config

__all__ = ["ComputeTimer", "Config", "ConfigError", "TrainerClient", "load_config"]
