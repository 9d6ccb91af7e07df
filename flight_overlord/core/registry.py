"""Things registered by name (balancers, cost models, sample transforms, context-parallel splits):
``Registry`` and its ``UnknownName`` error. The code lives in ``core/balance/registry.py`` because
the balance package is self-contained (it imports nothing of this project, so it can be vendored
alone); everything else imports it from here.
"""
from .balance.registry import Registry, UnknownName

__all__ = ["Registry", "UnknownName"]
