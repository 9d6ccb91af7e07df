"""The shuffle window (sources[].shuffle_window): K row groups' rows drawn interleaved, as a pure
function of (seed, source, epoch), exact across a state round trip and the planner's bulk draw."""
from __future__ import annotations

import numpy as np
import pytest

from flight_overlord.core.order import RowGroupRef
from flight_overlord.planner.feed import SourceFeed

CATALOG = [RowGroupRef(f"f{f}.parquet", g, 7 + 3 * g) for f in range(3) for g in range(4)]
ROWS = sum(rg.num_rows for rg in CATALOG)


def meta(epoch, rg):
    lengths = 1 + (np.arange(rg.num_rows) + rg.row_group) % 5  # per row, so the bulk draw has work to do
    return {"num_tokens": lengths.astype(np.int64)}


def feed(window: int, seed: int = 3) -> SourceFeed:
    return SourceFeed("s", CATALOG, seed, meta, window)


def stream(window: int, n: int, seed: int = 3) -> list:
    f = feed(window, seed)
    return [f.next().ref for _ in range(n)]


@pytest.mark.parametrize("window", [2, 4, 5, 12, 20])
def test_a_window_visits_every_row_once_per_epoch_in_a_seeded_order(window):
    first = stream(window, 2 * ROWS)
    assert first == stream(window, 2 * ROWS)
    epoch0, epoch1 = first[:ROWS], first[ROWS:]
    assert len({r.key for r in epoch0}) == ROWS and {r.epoch for r in epoch0} == {0}
    assert {r.key for r in epoch1} == {r.key for r in epoch0} and {r.epoch for r in epoch1} == {1}
    assert [r.key for r in epoch0] != [r.key for r in stream(1, ROWS)]


def test_window_rows_interleave_across_row_groups():
    def switches(refs):  # how often consecutive samples come from another row group
        return sum((a.file, a.row_group) != (b.file, b.row_group) for a, b in zip(refs, refs[1:]))
    assert switches(stream(1, ROWS)) == len(CATALOG) - 1
    assert switches(stream(4, ROWS)) > ROWS / 2


@pytest.mark.parametrize("cut", [1, 23, 57, ROWS + 5])
def test_window_state_round_trips_mid_window_with_a_backlog(cut):
    reference = stream(4, 2 * ROWS)
    f = feed(4)
    head = [f.next() for _ in range(cut)]
    f.defer(head[-1:])
    restored = feed(4)
    restored.load_state_dict(f.state_dict())
    rest = [restored.next().ref for _ in range(2 * ROWS - cut + 1)]
    assert [p.ref for p in head[:-1]] + rest == reference


def test_the_bulk_draw_gives_what_next_gives():
    reference = stream(4, 3 * ROWS // 2)
    f = feed(4)
    drawn = []
    for n in (5, 40, 1, 33, 3 * ROWS // 2 - 79):
        s = f.stream()
        s.take(n)
        drawn += [p.ref for p in s.picks()]
    assert drawn == reference
    one_by_one = feed(4)
    expected = [one_by_one.next() for _ in range(60)]
    g = feed(4)
    s = g.stream()
    tokens = [s.next_tokens() for _ in range(60)]
    assert [p.ref for p in s.picks()] == [p.ref for p in expected]
    assert tokens == [p.tokens for p in expected]
