"""What a Data Constructor holds: the staged tables of assembled steps, until its ranks have them.

Pure bookkeeping, no Flight and no threads: the server guards it with its lock.
"""
from __future__ import annotations

import pyarrow as pa


class Staging:
    """Staged tables keyed by (step, delivery key); a step is released once every stream reading from
    this constructor is ``keep`` steps past it, so a retried fetch still finds it."""

    def __init__(self, streams: int, keep: int = 2):
        self.streams = streams        # (kind, rank) streams that read from here
        self.keep = keep
        self.next_step = 0            # the next step to assemble
        self.tables: dict[tuple[int, tuple], pa.Table] = {}
        self._served: dict[tuple[str, int], int] = {}  # (kind, rank) -> last step served
        self.silent: frozenset[int] = frozenset()  # ranks that may never read: served while staged, never waited for

    def stage(self, step: int, tables: dict[tuple[int, tuple], pa.Table]) -> None:
        self.tables.update(tables)
        self.next_step = step + 1

    def assembled(self, step: int) -> bool:
        return step < self.next_step

    def served(self, kind: str, rank: int, step: int) -> None:
        if rank in self.silent:
            return
        self._served[(kind, rank)] = max(step, self._served.get((kind, rank), -1))
        if len(self._served) < self.streams:
            return
        done = min(self._served.values()) - self.keep
        for key in [k for k in self.tables if k[0] <= done]:
            del self.tables[key]

    def steps(self) -> list[int]:
        return sorted({k[0] for k in self.tables})

    def state_dict(self) -> dict:
        return {"next_step": self.next_step,
                "served": [[kind, rank, step] for (kind, rank), step in sorted(self._served.items())]}

    def load_state_dict(self, state: dict) -> None:
        self.next_step = int(state["next_step"])
        self._served = {(kind, int(rank)): int(step) for kind, rank, step in state["served"]}
        self.tables.clear()
