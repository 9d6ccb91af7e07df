"""A loader actor's state, without I/O: how far the Planner has asked, and what has been popped.

Slots number this actor's infinite read order (slot p is row group p % n of epoch p // n).
Changes arrive as records (``demand``, ``fetch``) that are appended to the actor's journal and
applied here; applying is idempotent, so the active loader, its restart and its shadows all fold
the same journal into the same state (the paper's differential checkpointing: a snapshot every
so often, the journal in between).
"""
from __future__ import annotations

from ..stateful import Stateful


class LoaderState(Stateful):
    def __init__(self):
        self.demanded = -1                       # furthest slot the Planner asked metadata for
        self.popped: dict[int, set[int]] = {}    # slot -> rows served to every constructor that needs them
        self.partial: dict[tuple[int, int], set[int]] = {}  # (slot, row) -> constructors that have it
        self.released_below = 0                  # every slot below this was served whole
        self.released: set[int] = set()          # slots at or above released_below served whole
        self.segments: list[list[int]] = []      # the source's ownership segments, when resharded (core/scaling)

    def apply(self, record: dict) -> list[int]:
        """Fold one journal record in; returns the slots whose popped rows changed."""
        if "demand" in record:
            self.demanded = max(self.demanded, int(record["demand"]))
            return []
        if "fetch" in record:
            constructor = int(record["constructor"])
            touched = set()
            for slot, row, consumers in record["rows"]:
                if self._fetched(int(slot), int(row), int(consumers), constructor):
                    touched.add(int(slot))
            return sorted(touched)
        if "release" in record:
            self.release(int(record["release"]))
            return []
        if "segments" in record:  # a live reshard: the longer list is the newer (segments only get appended)
            if len(record["segments"]) > len(self.segments):
                self.segments = [[int(f), int(a)] for f, a in record["segments"]]
            return []
        raise ValueError(f"unknown loader journal record {sorted(record)}")

    def _fetched(self, slot: int, row: int, consumers: int, constructor: int) -> bool:
        """A constructor has a sample; it is popped once every constructor that needs it has it. A
        released slot's rows were all popped: a step built again for a rank that went back changes nothing."""
        if self.is_released(slot):
            return False
        if consumers > 1:
            have = self.partial.setdefault((slot, row), set())
            have.add(constructor)
            if len(have) < consumers:
                return False
            del self.partial[(slot, row)]
        self.popped.setdefault(slot, set()).add(row)
        return True

    def release(self, slot: int) -> None:
        """Every servable row of ``slot`` is popped: forget it (its buffer is dropped). Idempotent:
        a replica folds its own release records in again when it follows the journal."""
        self.popped.pop(slot, None)
        if slot < self.released_below:
            return
        self.released.add(slot)
        while self.released_below in self.released:
            self.released.discard(self.released_below)
            self.released_below += 1

    def is_released(self, slot: int) -> bool:
        return slot < self.released_below or slot in self.released

    def state_dict(self) -> dict:
        return {"demanded": self.demanded,
                "popped": {str(p): sorted(rows) for p, rows in sorted(self.popped.items())},
                "partial": [[p, r, sorted(c)] for (p, r), c in sorted(self.partial.items())],
                "released_below": self.released_below, "released": sorted(self.released),
                "segments": self.segments}

    def load_state_dict(self, state: dict) -> None:
        self.demanded = int(state["demanded"])
        self.popped = {int(p): set(rows) for p, rows in state["popped"].items()}
        self.partial = {(int(p), int(r)): set(c) for p, r, c in state["partial"]}
        self.released_below = int(state["released_below"])
        self.released = set(state["released"])
        self.segments = [[int(f), int(a)] for f, a in state.get("segments", [])]
