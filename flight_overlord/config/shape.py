"""Config keys that shape a run over its steps: ``skip`` (steps whose first draw is dropped)."""
from __future__ import annotations

from typing import Any

from ..core.skips import checked_window, parse_window
from .model import ConfigError


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
