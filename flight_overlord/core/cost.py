"""Cost models: the estimated compute of a sample from its metadata."""
from __future__ import annotations

import numpy as np

from ..config import CostConfig


def sample_costs(num_tokens: np.ndarray, cfg: CostConfig) -> np.ndarray:
    """``attention``: a*l + b*l^2 (linear layers plus quadratic attention); ``tokens``: l."""
    l = np.asarray(num_tokens, dtype=np.float64)
    if cfg.model == "tokens":
        return l
    return cfg.a * l + cfg.b * l * l
