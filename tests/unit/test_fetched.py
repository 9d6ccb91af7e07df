"""A loader's answer as samples (constructor/fetched.py): one call per loader process, rows back in
plan order, each sample cut to its planned length, and a short answer named."""
from __future__ import annotations

import pytest

from flight_overlord.constructor.fetched import fetch_groups, received

from .constructor_data import HOST_C, TOKENS, fetched, loader_answer, make_cfg, plan


def test_one_call_per_loader_process_in_plan_order(tmp_path):
    calls = fetch_groups(plan())
    assert [[(g.source, g.actor) for g in groups] for groups in calls] == [[("a", 0), ("b", 0)], [("c", 0)]]
    samples = fetched(make_cfg(tmp_path), plan())
    assert list(samples) == [0, 2, 3, 1]  # the plan's fetch order, though a and b came back in one table
    assert {i: s.key for i, s in samples.items()} == dict(enumerate(TOKENS))


def test_a_sample_is_cut_to_its_planned_length(tmp_path):
    samples = fetched(make_cfg(tmp_path), plan())
    assert samples[2].tokens.tolist() == [9, 10, 11]
    assert samples[0].tokens.tolist() == TOKENS["a:0"]


def test_a_loader_answer_of_the_wrong_size_names_the_loader(tmp_path):
    p = plan()
    groups = fetch_groups(p)[1]
    with pytest.raises(RuntimeError, match=f"the loader at {HOST_C} returned 1 samples for 2 asked"):
        received(make_cfg(tmp_path), 0, p, groups, loader_answer(["c:0"]))
