"""Steps whose first draw is dropped on purpose (``overlord skip``, the config's ``skip:``): after a
loss spike, the samples those steps would have had are not trained; each such step is drawn again
from the samples that follow, so a trainer's step numbers (and its optimizer's) stay as they were.

Plain state: the windows [first, last] of steps, inclusive, in the order they were set.
"""
from __future__ import annotations


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


class StepSkips:
    def __init__(self, windows=()):
        self.windows: list[tuple[int, int]] = [(int(a), int(b)) for a, b in windows]

    def covers(self, step: int) -> bool:
        return any(first <= step <= last for first, last in self.windows)

    def add(self, first: int, last: int) -> bool:
        """Set a window; False when it was set already (setting it again changes nothing)."""
        if (first, last) in self.windows:
            return False
        self.windows.append((first, last))
        return True

    def new_in(self, windows) -> list[tuple[int, int]]:
        """Of ``windows``, those not set yet."""
        return [tuple(w) for w in windows if tuple(w) not in self.windows]

    def state_dict(self) -> list:
        return [[a, b] for a, b in self.windows]

    def load_state_dict(self, state: list) -> None:
        self.windows = [(int(a), int(b)) for a, b in state]
