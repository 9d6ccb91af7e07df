"""RankSet: ranks as an operator writes them."""
from __future__ import annotations

import pytest

from flight_overlord.core.ranks import RankSet


def test_rank_sets():
    ranks = RankSet.parse("16-23, 0-7,12")
    assert [r for r in range(30) if r in ranks] == [*range(8), 12, *range(16, 24)]
    assert str(ranks) == "0-7,12,16-23" and ranks.last == 23
    assert "3" not in ranks and True not in RankSet.parse("1")


@pytest.mark.parametrize("text", ["", "a", "3-1", "-2", "1-2-3", "0,,1"])
def test_a_bad_rank_set_is_named(text):
    with pytest.raises(ValueError, match="rank"):
        RankSet.parse(text)
