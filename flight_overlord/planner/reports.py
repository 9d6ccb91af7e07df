"""The checks of a trainer's report, before anything of it is recorded or journaled."""
from __future__ import annotations

import math


def finite_loss(value, what: str) -> float:
    """A reported loss as a float; anything but a finite number is an error naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"report: {what} must be a finite number, got {value!r}")
    return float(value)


def checked_report(cfg, mesh, planner, step: int, rank: int, losses: dict | None, body: dict) -> float | None:
    """Raise, naming what is wrong, unless the report is one to record: a rank of the mesh, a planned
    step, known sources with finite losses, timings of a fitted model. Returns the overall loss, if any."""
    planner.check_compute_report(body)
    mesh.coord(rank)
    for source, loss in (losses or {}).items():
        cfg.source(source)  # names the unknown source
        finite_loss(loss, f"loss of source {source!r}")
    if not 0 <= step < planner.next_step:
        raise ValueError(f"report: step {step} was not planned (planned: 0..{planner.next_step - 1})")
    return None if body.get("loss") is None else finite_loss(body["loss"], "the overall loss")
