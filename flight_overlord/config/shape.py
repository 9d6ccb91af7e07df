"""Config keys that shape a run over its steps: ``schedule`` (the global batch and context stages per
step, ``core/run_shape.py``) and ``skip`` (windows of steps whose samples are dropped, ``core/skips.py``)."""
from __future__ import annotations

from typing import Any

from ..core.run_shape import RunShape, batch_ramp, batch_steps, checked_stages, context_stage
from ..core.skips import checked_window, parse_window
from .fields import as_int, as_number, check_keys
from .model import ConfigError, GlobalBatchConfig


def shape_keys(top: dict, global_batch: GlobalBatchConfig) -> dict:
    """The ``Config`` fields of the top-level keys ``schedule`` and ``skip``."""
    return {"schedule": parse_schedule(top["schedule"], global_batch), "skip": parse_skips(top["skip"])}


def parse_skips(raw: Any) -> tuple[tuple[int, int], ...]:
    """``skip: ["10:14", [30, 31], 40]``: windows of steps, both ends included."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"skip: expected a list of step windows such as \"10:14\", got {raw!r}")
    windows = []
    for i, item in enumerate(raw):
        try:
            if isinstance(item, list) and len(item) == 2:
                windows.append(checked_window(item[0], item[1], where=f"skip[{i}]"))
            elif isinstance(item, (str, int)) and not isinstance(item, bool):
                windows.append(parse_window(str(item), f"skip[{i}]"))
            else:
                raise ValueError(f"skip[{i}]: expected \"FIRST:LAST\" or [FIRST, LAST], got {item!r}")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return tuple(windows)


def parse_schedule(raw: Any, global_batch: GlobalBatchConfig) -> RunShape:
    """``schedule: {batch: {ramp: {from, to, start, end}} | {steps: [[first_step, size], ...]},
    context: [{from_step, context_length, microbatches, weights}, ...]}``; sizes in global_batch's unit."""
    f = check_keys(raw, "schedule", {"batch": None, "context": None})
    try:
        return RunShape(_batch(f["batch"]), _stages(f["context"], global_batch))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _batch(raw: Any):
    if raw is None:
        return None
    f = check_keys(raw, "schedule.batch", {"ramp": None, "steps": None})
    if (f["ramp"] is None) == (f["steps"] is None):
        raise ConfigError("schedule.batch: give one of ramp: {from, to, start, end} or steps: "
                          "[[first_step, size], ...]")
    if f["ramp"] is not None:
        r = check_keys(f["ramp"], "schedule.batch.ramp", {"from": None, "to": None, "start": 0, "end": None})
        values = {k: as_int(r[k], f"schedule.batch.ramp.{k}", minimum=0) for k in ("from", "to", "start", "end")}
        return batch_ramp(values["from"], values["to"], values["start"], values["end"])
    if not isinstance(f["steps"], list) or not all(isinstance(x, list) and len(x) == 2 for x in f["steps"]):
        raise ConfigError(f"schedule.batch.steps: expected [[first_step, size], ...], got {f['steps']!r}")
    return batch_steps([(as_int(a, f"schedule.batch.steps[{i}][0]", minimum=0),
                         as_int(b, f"schedule.batch.steps[{i}][1]", minimum=1)) for i, (a, b) in enumerate(f["steps"])])


def _stages(raw: Any, global_batch: GlobalBatchConfig) -> tuple:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"schedule.context: expected a list of stages, got {raw!r}")
    stages = []
    for i, item in enumerate(raw):
        where = f"schedule.context[{i}]"
        f = check_keys(item, where, {"from_step": None, "context_length": None,
                                     "microbatches": global_batch.microbatches, "weights": None})
        weights = f["weights"]
        if weights is not None:
            if not isinstance(weights, dict):
                raise ConfigError(f"{where}.weights: expected a mapping of source to weight, got {weights!r}")
            weights = {str(k): as_number(v, f"{where}.weights.{k}", minimum=0.0) for k, v in weights.items()}
        stages.append(context_stage(as_int(f["from_step"], f"{where}.from_step", minimum=0),
                                    as_int(f["context_length"], f"{where}.context_length", minimum=1),
                                    as_int(f["microbatches"], f"{where}.microbatches", minimum=1), weights))
    return checked_stages(stages)
