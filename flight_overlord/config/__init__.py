"""The run configuration: YAML in, validated typed objects out (``model``: the sections;
``parse``: reading and validating them, errors naming the key or file)."""
from .model import (
    BalanceConfig,
    CheckpointConfig,
    Config,
    ConfigError,
    ConstructorConfig,
    CostConfig,
    GlobalBatchConfig,
    LivenessConfig,
    LoaderConfig,
    NetworkConfig,
    SecurityConfig,
    SourceConfig,
    StrategyConfig,
    TLSConfig,
    TransformConfig,
    VisionConfig,
)
from .parse import balance_methods, load_config, parse_config

__all__ = ['BalanceConfig', 'CheckpointConfig', 'Config', 'ConfigError', 'ConstructorConfig', 'CostConfig',
           'GlobalBatchConfig', 'LivenessConfig', 'LoaderConfig', 'NetworkConfig', 'SecurityConfig', 'SourceConfig',
           'StrategyConfig', 'TLSConfig', 'TransformConfig', 'VisionConfig', 'balance_methods', 'load_config',
           'parse_config']
