"""Everything a strategy file uses, in one import:

    from flight_overlord.orchestration import linear, staged, cosine, dynamic, loss_weighted
    from flight_overlord.orchestration import batch_ramp, batch_steps, context_stage   # the run's shape

and every way to add a named piece (``core/registry.py``: a taken name or an unknown one is an
error naming them): ``register_balancer``, ``register_cost_model``, ``register_transform``,
``register_cp_split``.
"""
from .core.balance import partition, register_balancer
from .core.context_parallel import CPSplit, register_cp_split
from .core.cost import attention_cost, patches_cost, register_cost_model, tokens_cost
from .core.registry import Registry, UnknownName
from .core.run_shape import batch_ramp, batch_steps, context_stage
from .core.schedules import FeedbackLog, Schedule, constant, cosine, dynamic, linear, loss_weighted, staged
from .planner.program import PlanContext, fill_in_order
from .planner.strategy import Strategy, load_strategy
from .transforms import register_transform

__all__ = ["CPSplit", "FeedbackLog", "PlanContext", "Registry", "Schedule", "Strategy", "UnknownName",
           "attention_cost", "batch_ramp", "batch_steps", "constant", "context_stage", "cosine", "dynamic",
           "fill_in_order", "linear", "load_strategy", "loss_weighted", "partition", "patches_cost",
           "register_balancer", "register_cost_model", "register_cp_split", "register_transform", "staged",
           "tokens_cost"]
