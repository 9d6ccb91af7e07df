"""Starvation attribution's logic (core/starvation.py), without servers. End to end with a source
slowed on purpose: tests/integration/test_starvation.py."""
from __future__ import annotations

import pytest

from flight_overlord.core.starvation import StageTimeline, TrainerWaits, fetch_shares, summarize, with_trainer_side


def test_a_wait_is_charged_to_the_stages_it_overlapped():
    timeline = StageTimeline()
    timeline.stage(0.0, 1.0, "plan")
    timeline.stage(1.0, 4.0, shares=fetch_shares(3.0, {"web": 2.0, "code": 0.5}))  # the fetch's critical call
    timeline.stage(4.0, 5.0, "assembly")
    charged = timeline.waited(0, 0.5, 6.0)  # asked mid-plan, served a second after assembly
    assert charged == pytest.approx({"plan": 0.5, "loader:web": 2.0, "loader:code": 0.5, "loader network": 0.5,
                                     "assembly": 1.0, "other": 1.0})
    timeline.waited(0, 4.5, 5.0)
    assert timeline.totals()[0]["assembly"] == pytest.approx(1.5)


def test_the_summary_names_the_source_that_starves_which_ranks():
    ranks = {0: {"loader:web": 3.0, "assembly": 0.5}, 1: {"loader:web": 2.0, "ticket": 1.0},
             2: {"plan": 4.0, "loader:web": 1.0}, 3: {"assembly": 0.01}}
    summary = summarize(ranks)
    assert [(c["stage"], c["source"], c["ranks"]) for c in summary["causes"]] == [
        ("loader fetch", "web", [0, 1]), ("plan", None, [2])]
    assert summary["ranks"]["0"]["cause"] == {"stage": "loader fetch", "source": "web", "share": 3.0 / 3.5}
    assert summary["ranks"]["3"]["cause"] is None  # 10 ms: not starving


def test_trainer_side_adds_ticket_and_transfer_and_checks_its_input():
    assert with_trainer_side({"loader:web": 1.0}, {"ticket": 0.2, "fetch": 1.5, "starved": 0.9}) == pytest.approx(
        {"loader:web": 1.0, "ticket": 0.2, "transfer": 0.3})
    assert with_trainer_side({"plan": 1.0}, None) == {"plan": 1.0}
    waits = TrainerWaits(keep=2)
    for step in range(3):
        waits.add(0, {"ticket": 0.1, "fetch": 1.0 + step, "starved": 0.5})
    assert waits.totals()[0] == pytest.approx({"ticket": 0.2, "fetch": 5.0, "starved": 1.0, "steps": 2})
    with pytest.raises(ValueError, match="unknown wait 'lunch'"):
        waits.add(0, {"lunch": 1.0})
    with pytest.raises(ValueError, match="finite number of seconds"):
        waits.add(0, {"fetch": -1.0})
