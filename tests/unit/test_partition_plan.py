"""Offline source auto-partitioning, the pure planner (core/partition_plan.py): deterministic, within
its budget, more actors for a source that is too big or too costly (with the reason), clear errors."""
from __future__ import annotations

import dataclasses
import random

import pytest

from flight_overlord.core.partition_plan import (
    NODE_BASE_BYTES,
    Budget,
    GiB,
    MiB,
    PartitionPlan,
    SourceProfile,
    actor_bytes,
    plan_partition,
    render,
    single_node_advice,
)


def _profile(name, *, weight=1.0, us=50.0, rg_mib=1.0, reader_mib=0.5, row_groups=12, files=3):
    return SourceProfile(name=name, weight=weight, row_groups=row_groups, files=files, rows=row_groups * 100,
                         mean_tokens=500.0, seconds_per_sample=us * 1e-6, seconds_per_byte=us * 1e-6 / 2000,
                         row_group_bytes=rg_mib * MiB, reader_bytes=reader_mib * MiB)


PROFILES = [_profile(f"s{i:02d}", weight=1 + i % 3, us=10 + 7 * i, rg_mib=0.2 + 0.1 * (i % 5)) for i in range(20)]


def _check_within(plan: PartitionPlan, profiles, budget: Budget):
    hosts = len(plan.hosts)
    assert 1 <= hosts <= int(budget.cpus)
    placed = [a for host in plan.hosts for a in host]
    assert sorted(placed) == sorted((s.name, a) for s in plan.sources for a in range(s.actors))  # each actor once
    assert all(b <= budget.memory_bytes / hosts + 1e-6 for b in plan.host_bytes)
    assert sum(plan.host_bytes) <= budget.memory_bytes
    by_name = {p.name: p for p in profiles}
    assert all(1 <= s.actors <= by_name[s.name].row_groups for s in plan.sources)


def test_same_profile_same_plan_whatever_the_order():
    budget = Budget(4, 2 * GiB)
    plan = plan_partition(PROFILES, budget)
    shuffled = PROFILES[:]
    random.Random(1).shuffle(shuffled)
    assert plan_partition(shuffled, budget).to_dict() == plan.to_dict()
    assert PartitionPlan.from_dict(plan.to_dict()) == plan  # journaled and read back unchanged
    # hosts are balanced by cost: clusters of sources by cost, dealt longest first
    assert max(plan.host_cost) - min(plan.host_cost) < 0.1


@pytest.mark.parametrize("cpus,gib", [(1, 0.5), (2, 1.0), (3, 4.0), (8, 2.0)])
def test_budgets_respected(cpus, gib):
    budget = Budget(cpus, gib * GiB)
    _check_within(plan_partition(PROFILES, budget), PROFILES, budget)


def test_a_source_too_large_for_the_memory_budget_gets_more_actors_with_the_reason():
    big = _profile("huge", reader_mib=600, row_groups=16, files=16)  # 600 MiB of file states in one actor
    profiles = PROFILES[:6] + [big]
    budget = Budget(4, 2 * GiB)  # a host's share: 512 MiB - its process
    plan = plan_partition(profiles, budget)
    huge = next(s for s in plan.sources if s.name == "huge")
    assert huge.actors >= 2 and actor_bytes(big, 1, 2) > budget.memory_bytes / 4
    assert huge.actor_bytes <= budget.memory_bytes / len(plan.hosts)
    assert any(r.startswith("memory:") for r in huge.reasons)
    assert "memory:" in render(plan, profiles)
    hosts_of_huge = {h for h, host in enumerate(plan.hosts) for s, _ in host if s == "huge"}
    assert len(hosts_of_huge) == huge.actors  # its actors are spread over hosts
    _check_within(plan, profiles, budget)
    assert not any(r.startswith("memory:") for s in plan.sources if s.name != "huge" for r in s.reasons)


def test_a_source_with_most_of_the_cost_gets_an_actor_per_cpu_it_needs():
    profiles = PROFILES[:4] + [_profile("costly", us=5000, weight=3)]
    plan = plan_partition(profiles, Budget(4, 4 * GiB))
    costly = next(s for s in plan.sources if s.name == "costly")
    assert costly.cost_share > 0.9 and costly.actors == 4 and costly.reasons[0].startswith("cpu:")
    # capped by its row groups
    few = [dataclasses.replace(p, row_groups=2) if p.name == "costly" else p for p in profiles]
    assert next(s for s in plan_partition(few, Budget(4, 4 * GiB)).sources if s.name == "costly").actors == 2


@pytest.mark.parametrize("budget,match", [
    (Budget(0, GiB), "cpus must be a positive number"),
    (Budget(-2, GiB), "cpus must be a positive number"),
    (Budget(0.5, GiB), "cpus must be >= 1"),
    (Budget(2, 0), "memory must be a positive number"),
    (Budget(2, float("nan")), "memory must be a positive number"),
    (Budget(4, 0.2 * GiB), "leaves nothing for their actors"),
])
def test_bad_budgets_are_clear_errors(budget, match):
    with pytest.raises(ValueError, match=match):
        plan_partition(PROFILES, budget)


def test_a_source_that_fits_nowhere_is_named():
    rows = _profile("fat", rg_mib=300)  # 3 buffered row groups of 300 MiB whatever the actors
    with pytest.raises(ValueError, match=r"source 'fat' does not fit the memory budget.*read_ahead"):
        plan_partition(PROFILES[:3] + [rows], Budget(2, 1 * GiB))
    # reading no row group ahead (loader.read_ahead_bytes: 1) it fits: one row group buffered, not three
    fits = plan_partition(PROFILES[:3] + [rows], Budget(2, 1 * GiB), read_ahead_bytes=1)
    assert next(s.actor_bytes for s in fits.sources if s.name == "fat") < 301 * MiB
    with pytest.raises(ValueError, match="memory budget .* too small"):
        plan_partition([_profile(f"m{i}", rg_mib=40) for i in range(10)], Budget(2, 0.5 * GiB))


def test_a_node_whose_memory_holds_the_buffers_and_one_process_is_advised_single_node():
    plan = plan_partition(PROFILES, Budget(2, 2 * GiB))
    advice = single_node_advice(plan)
    assert "recommended `deployment: single_node`" in advice and "2 CPUs" in advice
    assert f"all {sum(s.actors for s in plan.sources)} actors" in advice
    # the same buffers on a node with less memory than they and the process need: not one process
    tight = dataclasses.replace(plan, budget=Budget(2, sum(plan.host_bytes) + NODE_BASE_BYTES - 1))
    assert "exceed the memory budget" in single_node_advice(tight)
