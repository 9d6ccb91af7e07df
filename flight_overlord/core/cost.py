"""Cost models: the estimated compute of each sample from its metadata.

A cost function takes the step's sample metadata as arrays (``num_tokens``, ``image_patches``,
``source``) and returns one cost per sample. Cost models are registered by name (the config's
``cost.model``, ``Strategy.cost("name")``); ``Strategy.cost`` also takes any function.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .registry import Registry

CostFn = Callable[[dict], np.ndarray]
COST_MODELS: Registry = Registry("cost model", hint="or pass a function of the sample metadata")


def register_cost_model(name: str):
    """Decorator: ``factory(**params) -> CostFn`` becomes available as ``cost(name, **params)``."""
    return COST_MODELS.register(name)


def make_cost(name: str, **params) -> CostFn:
    factory = COST_MODELS[name]
    try:
        return factory(**params)
    except TypeError as exc:
        raise ValueError(f"cost model {name!r}: bad parameters {params}: {exc}") from None


@register_cost_model("tokens")
def tokens_cost() -> CostFn:
    return lambda meta: np.asarray(meta["num_tokens"], dtype=np.float64)


@register_cost_model("attention")
def attention_cost(a: float, b: float) -> CostFn:
    """a*l + b*l^2: linear layers plus quadratic attention."""
    def cost(meta):
        length = np.asarray(meta["num_tokens"], dtype=np.float64)
        return a * length + b * length * length
    return cost


@register_cost_model("patches")
def patches_cost(a: float = 1.0, b: float = 0.0) -> CostFn:
    """A vision encoder's work: a*p + b*p^2 over a sample's image patches."""
    def cost(meta):
        patches = np.asarray(meta["image_patches"], dtype=np.float64)
        return a * patches + b * patches * patches
    return cost


def config_cost(cfg) -> CostFn:
    """The config's ``cost`` section (model, a, b); ``a`` and ``b`` go to the models that take them."""
    if cfg.model == "attention":
        return attention_cost(cfg.a, cfg.b)
    return make_cost(cfg.model)
