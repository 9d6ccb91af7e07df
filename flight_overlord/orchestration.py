"""Everything a strategy file uses, in one import:

    from flight_overlord.orchestration import linear, staged, cosine, dynamic, loss_weighted
"""
from .core.cost import attention_cost, patches_cost, tokens_cost
from .core.schedules import FeedbackLog, Schedule, constant, cosine, dynamic, linear, loss_weighted, staged
from .planner.program import PlanContext, fill_in_order
from .planner.strategy import Strategy, load_strategy
from .core.balance import partition

__all__ = ["FeedbackLog", "PlanContext", "Schedule", "Strategy", "attention_cost", "constant", "cosine", "dynamic",
           "fill_in_order", "linear", "load_strategy", "loss_weighted", "partition", "patches_cost", "staged",
           "tokens_cost"]
