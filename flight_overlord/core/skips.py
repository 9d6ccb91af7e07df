"""Windows of steps whose samples are dropped on purpose (``overlord skip``, the config's ``skip:``):
after a loss spike, the samples steps A..B would have had are not trained. When step A is planned,
the draws of steps A..B are made (as an undisturbed run would have made them) and dropped, and step A
is planned from the samples after them: the stream moves on by the window, as PaLM skipped 200-500
batches, while a trainer's step numbers (and its optimizer's) stay as they were.

Plain state: the windows [first, last] of steps, inclusive, in the order they were set.
"""
from __future__ import annotations

from ..stateful import Stateful


def parse_window(text: str, where: str) -> tuple[int, int]:
    """``"A:B"`` (or ``"A"``) -> (A, B): steps A to B inclusive; ValueError naming ``where`` otherwise."""
    first, sep, last = str(text).partition(":")
    try:
        window = (int(first), int(last) if sep else int(first))
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not FIRST:LAST (step numbers, both included)") from None
    return checked_window(*window, where=where)


def checked_window(first: int, last: int, *, where: str) -> tuple[int, int]:
    if isinstance(first, bool) or isinstance(last, bool) or not isinstance(first, int) or not isinstance(last, int):
        raise ValueError(f"{where}: steps must be integers, got {first!r}:{last!r}")
    if not 0 <= first <= last:
        raise ValueError(f"{where}: {first}:{last} is no window of steps (need 0 <= FIRST <= LAST)")
    return first, last


def window(first: int, last: int, planned_to: int) -> list:
    """[first, last, start] of a window set when the steps before ``planned_to`` were planned."""
    return [first, last, first if first >= planned_to else None]


class StepSkips(Stateful):
    """The windows set, each [first, last, start]: the draws of steps start..last are dropped when step
    ``start`` is planned. ``start`` is ``first``, unless the window was set (in a resumed config) after
    its first steps were planned: then it is None until the re-plan says where the trainers resume
    (``replan_from``), since the steps before that were delivered as planned."""

    def __init__(self):
        self.windows: list[list] = []

    def to_drop(self, step: int) -> tuple[int, int] | None:
        """The steps whose draws are dropped before ``step`` is planned (None: none)."""
        for first, last, start in self.windows:
            if start == step:
                return step, last
        return None

    def add(self, first: int, last: int, *, planned_to: int) -> bool:
        """Set a window (``planned_to``: the steps before it are planned already); False when it was set
        already (setting it again changes nothing)."""
        if any((a, b) == (first, last) for a, b, _ in self.windows):
            return False
        self.windows.append(window(first, last, planned_to))
        return True

    def replan_from(self, step: int) -> None:
        """Planning starts again at ``step``: a window set after its first steps were planned drops the
        draws from ``step`` on (never, when ``step`` is past it)."""
        for window in self.windows:
            if window[2] is None:
                window[2] = max(window[0], step) if step <= window[1] else -1

    def new_in(self, windows) -> list[tuple[int, int]]:
        """Of ``windows``, those not set yet."""
        return [tuple(w) for w in windows if not any((a, b) == tuple(w) for a, b, _ in self.windows)]

    def state_dict(self) -> list:
        return [list(w) for w in self.windows]

    def load_state_dict(self, state: list) -> None:
        self.windows = [[int(w[0]), int(w[1]), w[2] if len(w) > 2 else int(w[0])] for w in state]
