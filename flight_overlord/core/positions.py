"""Where each trainer rank is, as the Planner knows it: pure bookkeeping, no I/O (the server locks it).

A rank says where it is when it asks for data (``asked``: its own word, which may be behind what an
earlier stream sent); while its stream runs, its constructor reports the next step the stream sends
(``reported``: positions only move forward). Reports die with their constructor: when it restarts, the
ranks it reported are *stale* until they ask again, and the restarted constructor waits for that before
it picks the step to resume at (a report may be ahead of what reached the trainer).
"""
from __future__ import annotations


class TrainerPositions:
    def __init__(self):
        self.requested: dict[int, int] = {}  # rank -> the step it waits for (asked or reported)
        self.reported_ranks: set[int] = set()  # ranks whose position a constructor reported
        self.stale: set[int] = set()         # reported ranks of a restarted constructor, until they ask again

    def asked(self, rank: int, step: int) -> None:
        """Rank ``rank`` asks for data from ``step`` (its stream, or that step alone): the trainer's own
        word, even if behind a report."""
        self.requested[rank] = step
        self.stale.discard(rank)

    def reported(self, positions: dict[int, int]) -> bool:
        """A constructor's stream positions (stale ranks are not moved); whether that changed what a
        waiter on the positions looks at: the slowest rank, or a rank known for the first time. A
        report that moves only ranks ahead of the slowest (three of four constructors' each step)
        then wakes nobody."""
        slowest, new = self.slowest(), False
        for rank, step in positions.items():
            if rank not in self.stale and step > self.requested.get(rank, -1):
                new = new or rank not in self.requested
                self.requested[rank] = step
                self.reported_ranks.add(rank)
        return new or self.slowest() != slowest

    def constructor_restarted(self, ranks: list[int]) -> None:
        self.stale |= self.reported_ranks.intersection(ranks)

    def settled(self, ranks: list[int]) -> bool:
        """No rank of ``ranks`` is stale: a restarted constructor may pick its resume step."""
        return not self.stale.intersection(ranks)

    def slowest(self) -> int:
        """The step the slowest rank waits for (-1 before any rank said where it is)."""
        return min(self.requested.values()) if self.requested else -1

    def rejoin_step(self, group, served: dict[int, int]) -> int:
        """Where the ranks of ``group`` (one replica group: the ranks of one data-parallel index) continue
        when they lost their state: the earliest step any of them waits for, each rank's being the later of
        its position here and the step after the last one its constructor served (``served``: positions
        are reported with plan requests, which run ahead). Every step before it went to the lost
        processes, so nothing comes twice; the group's ranks start together, so their tensor- and
        pipeline-parallel peers see the same step (one sent further goes back: a rewind). A group never
        heard of starts where the slowest rank is (0 on a fresh run)."""
        known = [max(self.requested.get(r, -1), served.get(r, -1) + 1) for r in group
                 if r in self.requested or r in served]
        return min(known) if known else max(self.slowest(), 0)


def checked_positions(raw, constructor: int, ranks) -> dict[int, int]:
    """A constructor's positions report, ``{rank: step}`` of the ranks it serves (``ranks``), checked."""
    if not isinstance(raw, dict):
        raise ValueError(f"malformed plan request: 'positions' must be an object, got {type(raw).__name__}")
    try:
        positions = {int(r): int(s) for r, s in raw.items()}
    except (TypeError, ValueError):
        raise ValueError("malformed plan request: 'positions' maps rank numbers to step numbers") from None
    if not positions.keys() <= set(ranks):
        raise ValueError(f"plan: positions name ranks {sorted(set(positions) - set(ranks))} "
                         f"that constructor {constructor} does not serve")
    return positions
