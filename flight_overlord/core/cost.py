"""Cost models: the estimated compute of each sample from its metadata.

A cost function takes the step's sample metadata as arrays (``num_tokens``, ``image_patches``,
``source``) and returns one cost per sample; ``Strategy.cost`` accepts these or any user function.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..config import CostConfig

CostFn = Callable[[dict], np.ndarray]


def tokens_cost() -> CostFn:
    return lambda meta: np.asarray(meta["num_tokens"], dtype=np.float64)


def attention_cost(a: float, b: float) -> CostFn:
    """a*l + b*l^2: linear layers plus quadratic attention."""
    def cost(meta):
        length = np.asarray(meta["num_tokens"], dtype=np.float64)
        return a * length + b * length * length
    return cost


def patches_cost(a: float = 1.0, b: float = 0.0) -> CostFn:
    """A vision encoder's work: a*p + b*p^2 over a sample's image patches."""
    def cost(meta):
        patches = np.asarray(meta["image_patches"], dtype=np.float64)
        return a * patches + b * patches * patches
    return cost


def config_cost(cfg: CostConfig) -> CostFn:
    return tokens_cost() if cfg.model == "tokens" else attention_cost(cfg.a, cfg.b)

