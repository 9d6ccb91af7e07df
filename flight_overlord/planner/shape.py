"""Before any role starts: a run's shape (its strategy, schedules and layout) is checked, and a resume
refuses a change that cannot continue exactly, naming the key.

A resume re-plans from the step the trainers resume at when the layout changed (data-parallel, context-
parallel or pipeline size, microbatches per rank, context length, the global batch and its schedule,
context stages, the distribution axis): the Planner restores the state the journal had after the step
before (every source's cursor and deferred samples, the mixer's credit) and plans on the new layout, so
nothing delivered comes again and nothing planned but undelivered is lost (``Planner.rewind``).
Tensor-parallel size changes no plan. What no re-plan can make exact is the read order itself: it
follows the seed.
"""
from __future__ import annotations

import json

from ..config import Config, ConfigError
from .strategy import Strategy, load_strategy

CONFIGS = "planner/configs.json"  # the config of every start (run_inputs.ConfigHistory)


def check_shape(cfg: Config, *, resume: bool) -> None:
    """The strategy with its schedules checked against the mesh (a bad stage or batch is named here,
    not by a Planner that fails to start); on a resume, the seed the run's steps were planned with."""
    try:
        load_strategy(cfg)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    path = cfg.run_dir / CONFIGS
    if not resume or not path.exists():
        return
    starts = json.loads(path.read_text())
    seed = (starts[-1].get("raw") or {}).get("seed", 0) if starts else cfg.seed
    if seed != cfg.seed:
        raise ConfigError(f"seed: {seed} when the run planned its steps, {cfg.seed} now; every source's read order "
                          f"and the journaled cursors into it follow the seed, so the resumed run would deliver some "
                          f"samples twice and lose others: keep seed {seed} (or start over with --fresh)")


def layout_of(strategy: Strategy) -> dict:
    """What the plans' shape follows: a resume under another layout re-plans from the trainers' step.
    Keys that were not always there (THD padding under CP, schedules) only when they say something, so a
    run journaled without them resumes on its own layout."""
    shape = strategy.shape()
    return {"axis": strategy.axis, "buckets": strategy.num_buckets,
            "microbatches": strategy.cfg.global_batch.microbatches, "capacity": strategy.capacity,
            "encoder_axis": strategy.image_graph.axis if strategy.image_graph else None,
            **({"seq_multiple": strategy.seq_multiple} if strategy.seq_multiple > 1 else {}),
            **({"shape": shape} if shape else {})}


def batch_of(cfg: Config) -> list:
    """The global batch per step as journaled: [unit, size]."""
    gb = cfg.global_batch
    return ["tokens", gb.tokens_per_step] if gb.tokens_per_step is not None else ["samples", gb.samples_per_step]
