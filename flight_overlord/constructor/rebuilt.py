"""Steps a constructor assembles again for ranks that went back to them (a trainer restarted from a
checkpoint while the data plane ran on): no I/O here, ``build(step)`` does it (the step's plan from
the Planner's journal, its samples from the loaders, the same assembly).

Each step is built once however many of the constructor's ranks ask for it at once (a data-parallel
job restarted as a whole rewinds all of them), and the last ``keep`` steps built stay for the ranks
that come a little later.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable


class RebuiltSteps:
    def __init__(self, build: Callable[[int], dict], keep: int):
        self._build = build
        self._keep = keep
        self._steps: OrderedDict[int, dict] = OrderedDict()  # step -> its tables, by delivery key
        self._building: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def tables(self, step: int) -> dict:
        """Step ``step``'s tables: kept, being built by another rank's request (waited for), or built now.
        A failed build raises here; a waiter then builds it itself."""
        while True:
            with self._lock:
                if step in self._steps:
                    self._steps.move_to_end(step)
                    return self._steps[step]
                event = self._building.get(step)
                mine = event is None
                if mine:
                    event = self._building[step] = threading.Event()
            if not mine:
                event.wait()
                continue
            try:
                tables = self._build(step)
                with self._lock:
                    self._steps[step] = tables
                    while len(self._steps) > self._keep:
                        self._steps.popitem(last=False)
                return tables
            finally:
                with self._lock:
                    del self._building[step]
                event.set()

    def steps(self) -> list[int]:
        with self._lock:
            return sorted(self._steps)
