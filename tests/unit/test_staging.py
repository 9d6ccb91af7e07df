"""constructor/staging.py: what a constructor holds of its assembled steps, and when it lets a step go."""
from __future__ import annotations

import pyarrow as pa

from flight_overlord.constructor.staging import Staging

from ..helpers import assert_round_trip


def _staged(staging: Staging, steps: range) -> None:
    for step in steps:
        staging.stage(step, {(step, ("rank", 0)): pa.table({"step": [step]})})


def test_a_step_is_kept_until_every_stream_is_keep_steps_past_it():
    staging = Staging(streams=2, keep=2)
    _staged(staging, range(5))
    assert staging.next_step == 5 and staging.assembled(4) and not staging.assembled(5)
    staging.served("batch", 0, 3)
    assert staging.steps() == [0, 1, 2, 3, 4]  # the other stream has said nothing yet: nothing goes
    staging.served("batch", 1, 2)
    assert staging.steps() == [1, 2, 3, 4]    # the slower stream is at 2: steps up to 0 go
    staging.served("batch", 1, 4)
    assert staging.steps() == [2, 3, 4]       # now the slower is at 3: up to 1


def test_a_silent_rank_is_never_waited_for():
    staging = Staging(streams=1, keep=0)
    staging.silent = frozenset({1})
    _staged(staging, range(3))
    staging.served("batch", 1, 2)  # a rank that may never read: served, not counted
    assert staging.steps() == [0, 1, 2]
    staging.served("batch", 0, 1)
    assert staging.steps() == [2]


def test_state_round_trips_and_a_restore_holds_no_tables():
    def advance(s):
        s.stage(s.next_step, {})
        s.served("batch", 0, s.next_step - 1)
    staging = Staging(streams=2)
    advance(staging)
    assert_round_trip(staging, lambda: Staging(streams=2), advance)
    _staged(staging, range(staging.next_step, staging.next_step + 2))
    restored = Staging(streams=2)
    restored.load_state_dict(staging.state_dict())
    assert restored.next_step == staging.next_step and restored.tables == {}
