"""The state contract every role's state object follows: ``Stateful``.

A role keeps what it must not lose in objects with ``state_dict()`` / ``load_state_dict(state)``, apart
from its Flight adapter, so the same state is journaled, snapshotted, restored and compared in tests:

- ``state_dict()`` returns plain JSON-able values (dicts with string keys, lists, numbers, strings,
  bools, None): no numpy, no sets, no objects, so ``json.dumps`` writes it as it is. A dict is the
  rule; an object whose state is one sequence of records may return that list.
- ``load_state_dict(state_dict())`` restores exactly: on an object built with the same arguments it
  gives back the same ``state_dict()``, and the object then behaves as the one it was taken from.
- What goes in: the inputs the role cannot derive again (cursors, credits, positions, reports,
  edits), never what a pure function of (config, seed, step) rebuilds. A role snapshots it every so
  often and journals the changes in between (``journal.py``), so a restart restores its latest
  snapshot and folds in the journal after it; its cost never grows with the step number.
"""
from __future__ import annotations

from typing import Protocol, Union, runtime_checkable

JSONState = Union[dict, list]


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> JSONState:
        """This object's state, as plain JSON-able values."""

    def load_state_dict(self, state: JSONState) -> None:
        """Restore the state ``state_dict()`` gave (of this object, or of one built the same way)."""
