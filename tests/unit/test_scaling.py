"""Mixture-driven scaling, the pure parts: when a source gets actors (moving average, thresholds,
consecutive intervals, determinism) and who owns which row group through a live reshard."""
from __future__ import annotations

import pytest

from flight_overlord.core.order import RowGroupRef, epoch_order, owned_row_groups
from flight_overlord.core.scaling import Ownership, Scaler

CATALOG = [RowGroupRef(f"f{f}.parquet", g, 10 + g) for f in range(3) for g in range(5)]  # 15 row groups
R = len(CATALOG)


def scaler(**overrides) -> Scaler:
    args = dict(interval=4, up_threshold=0.5, down_threshold=0.2, consecutive=2, max_actors=3)
    args.update(overrides)
    return Scaler({"web": 1, "code": 1}, **args)


def run(s: Scaler, weights_of_step, steps: int) -> list:
    return [e for step in range(steps) for e in s.observe(step, weights_of_step(step))]


def staged(step: int) -> dict:
    """code's share: 0.2 until step 12, 0.8 until step 40, then 0.1."""
    code = 0.2 if step < 12 else 0.8 if step < 40 else 0.1
    return {"web": 1 - code, "code": code}


def test_scale_up_after_consecutive_intervals_then_down_when_demand_falls():
    events = run(scaler(), staged, 64)
    code = [(e.step, e.previous, e.actors) for e in events if e.source == "code"]
    # intervals end at steps 3, 7, 11, ...; 12..15 and 16..19 are over 0.5 -> up at step 19 (load 0.8)
    # then 0.4 per actor: between the thresholds, nothing; 40..43, 44..47 at 0.05 per actor -> down at 47
    assert code == [(19, 1, 2), (47, 2, 1)]
    web = [(e.step, e.previous, e.actors) for e in events if e.source == "web"]
    # web: 0.8 until step 12 -> up at step 7; then 0.1 per actor (0.2 / 2) -> down after two intervals
    assert web[0] == (7, 1, 2) and web[1][2] == 1


def test_one_interval_over_the_threshold_is_not_enough():
    spike = lambda step: {"web": 0.2, "code": 0.8} if 4 <= step < 8 else {"web": 0.8, "code": 0.2}  # noqa: E731
    assert not [e for e in run(scaler(), spike, 40) if e.source == "code"]


def test_hysteresis_load_between_thresholds_changes_nothing():
    events = run(scaler(), lambda step: {"web": 0.6, "code": 0.4}, 80)
    assert [(e.source, e.actors) for e in events] == [("web", 2)]  # 0.6 -> 0.3 per actor: stays at 2


def test_max_actors_caps_and_configured_loaders_floor():
    s = Scaler({"web": 2, "code": 1}, interval=1, up_threshold=0.3, down_threshold=0.1, consecutive=1, max_actors=3)
    events = run(s, lambda step: {"web": 1.0, "code": 0.0}, 20)
    assert s.actors == {"web": 3, "code": 1}  # never above 3, never below code's configured 1
    assert [(e.source, e.actors) for e in events] == [("web", 3)]


def test_decisions_are_deterministic_and_survive_a_restore_mid_interval():
    whole = run(scaler(), staged, 64)
    assert whole == run(scaler(), staged, 64)
    first = scaler()
    before = run(first, staged, 18)  # mid-interval
    second = scaler()
    second.load_state_dict(first.state_dict())
    after = [e for step in range(18, 64) for e in second.observe(step, staged(step))]
    assert before + after == whole


def test_thresholds_that_could_flap_are_refused():
    with pytest.raises(ValueError, match="down_threshold"):
        scaler(down_threshold=0.3)


def test_one_segment_is_the_static_partition():
    for actors in (1, 2, 4):
        ownership = Ownership(CATALOG, seed=3, source="web", segments=[[0, actors]])
        for a in range(actors):
            mine = owned_row_groups(CATALOG, a, actors)
            view = ownership.actor_slots(a)
            expected = [rg for e in range(3) for rg in epoch_order(mine, seed=3, source="web", epoch=e)]
            got = [ownership.row_group(view.global_slot(p)) for p in range(3 * len(mine))]
            assert got == expected


def views_partition_the_order(ownership: Ownership, actors: int, slots: int) -> None:
    views = [ownership.actor_slots(a) for a in range(actors)]
    for g in range(slots):
        owner = ownership.owner_at(g)
        for a, v in enumerate(views):
            local = v.local(g)
            assert (local is not None) == (a == owner)
            if local is not None:
                assert v.global_slot(local) == g


@pytest.mark.parametrize("cursor, read_ahead", [(0, 2), (7, 2), (22, 1), (29, 3)])
def test_a_reshard_starts_past_every_read_ahead_and_keeps_what_was_read(cursor, read_ahead):
    ownership = Ownership(CATALOG, seed=5, source="code", segments=[[0, 2]])
    old = [ownership.actor_slots(a) for a in range(3)]
    # what each actor may have read: its slots up to its demand (every slot below the cursor
    # the feed asked for) plus read_ahead more
    read = {a: [v.global_slot(p) for p in range(v.first_local_at(cursor) + read_ahead) if v.global_slot(p) is not None]
            for a, v in enumerate(old)}
    boundary = ownership.boundary(cursor, read_ahead)
    assert all(g < boundary for slots in read.values() for g in slots)
    assert boundary - 1 in {g for slots in read.values() for g in slots} or boundary == cursor
    ownership.extend(boundary, 3)
    new = [ownership.actor_slots(a) for a in range(3)]
    for a in range(3):  # what was read keeps its owner and its local number
        for g in read[a]:
            assert new[a].local(g) == old[a].local(g)
    views_partition_the_order(ownership, 3, 5 * R)
    assert {ownership.owner_at(g) for g in range(boundary, boundary + R)} == {0, 1, 2}


def test_scale_down_ends_the_reclaimed_actors_slots():
    ownership = Ownership(CATALOG, seed=5, source="code", segments=[[0, 2]])
    boundary = ownership.boundary(18, 2)
    ownership.extend(boundary, 1)
    views_partition_the_order(ownership, 2, 5 * R)
    reclaimed = ownership.actor_slots(1)
    last = reclaimed.first_local_at(boundary)
    assert reclaimed.global_slot(last - 1) < boundary and reclaimed.global_slot(last) is None
    assert reclaimed.owned_per_epoch() == 0 and ownership.actor_slots(0).owned_per_epoch() == R


def test_up_then_down_then_up_again():
    ownership = Ownership(CATALOG, seed=1, source="qa", segments=[[0, 1]])
    for cursor, actors in ((4, 2), (31, 1), (50, 3)):
        ownership.extend(ownership.boundary(cursor, 2), actors)
    views_partition_the_order(ownership, 3, 8 * R)
    with pytest.raises(ValueError, match="does not extend"):
        ownership.extend(3, 2)


def test_an_actor_view_is_shared_by_threads():
    """An actor's read-ahead and request threads use one view: built lazily, it must not be built twice."""
    import threading
    catalog = [RowGroupRef("f.parquet", g, 1) for g in range(1500)]
    segments = [[0, 2], [2000, 3], [3500, 2]]
    expected = Ownership(catalog, seed=2, source="s", segments=segments).actor_slots(1)
    wanted = list(range(0, 4500, 11))
    truth = [expected.global_slot(p) for p in wanted]
    for _ in range(3):
        view = Ownership(catalog, seed=2, source="s", segments=segments).actor_slots(1)
        results, threads = {}, []
        for t in range(6):
            threads.append(threading.Thread(
                target=lambda t=t: results.__setitem__(t, [view.global_slot(p) for p in wanted])))
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert all(r == truth for r in results.values())


def test_slots_follow_the_seeded_read_order():
    ownership = Ownership(CATALOG, seed=9, source="web", segments=[[0, 1]])
    for epoch in range(3):
        order = epoch_order(CATALOG, seed=9, source="web", epoch=epoch)
        assert [ownership.row_group(epoch * R + i) for i in range(R)] == order
        slots = [ownership.slot(epoch, rg.file, rg.row_group) for rg in order]
        assert slots == list(range(epoch * R, (epoch + 1) * R))
    with pytest.raises(KeyError, match="not in source"):
        ownership.slot(0, "nope.parquet", 0)


def test_a_source_scales_only_up_to_its_own_maximum():
    s = Scaler({"web": 1, "code": 1}, interval=1, up_threshold=0.3, down_threshold=0.1, consecutive=1,
               max_actors={"web": 1, "code": 3})  # web is not among loader.scaling.sources
    run(s, lambda step: {"web": 0.5, "code": 0.5}, 10)
    assert s.actors == {"web": 1, "code": 2}


def test_scaling_config_names_what_is_wrong(tmp_path):
    from flight_overlord.config import ConfigError
    from flight_overlord.config.parse import parse_config
    (tmp_path / "a.parquet").write_bytes(b"")
    base = {"sources": [{"name": "a", "paths": "a.parquet"}, {"name": "b", "paths": "a.parquet", "loaders": 3}],
            "global_batch": {"context_length": 64, "microbatches": 1, "samples_per_step": 4}}

    def parsed(scaling):
        return parse_config({**base, "loader": {"scaling": scaling}}, base_dir=tmp_path)
    cfg = parsed({"enabled": True, "max_actors": 2, "sources": ["a"]})
    assert [cfg.provisioned_actors(s) for s in cfg.sources] == [2, 3]
    assert [parsed({"max_actors": 4}).provisioned_actors(s) for s in cfg.sources] == [1, 3]  # not enabled
    for bad, message in [({"sources": ["c"]}, "no source named 'c'"), ({"down_threshold": 0.3}, "up_threshold / 2"),
                         ({"enabled": "yes"}, "enabled"), ({"interval": 0}, "interval"), ({"max": 2}, "unknown key")]:
        with pytest.raises(ConfigError, match=message):
            parsed(bad)


def test_a_linear_curriculum_moving_weight_onto_a_source_scales_it_once():
    from flight_overlord.core.schedules import linear
    schedule = linear({"web": 1.0, "code": 0.0}, {"web": 0.1, "code": 0.9}, start=0, end=40)
    events = run(scaler(), lambda step: schedule.weights(step), 80)
    code = [(e.step, e.actors) for e in events if e.source == "code"]
    # code's interval means pass 0.5 in the interval ending at step 27: up after a second one, at 31;
    # then 0.45 per actor: it stays at 2 (below 0.5, above 0.2), and never reaches max_actors 3
    assert code == [(31, 2)]
    # web starts as the whole mixture (up at 7) and is reclaimed once under 0.2 per actor (w < 0.4) twice
    assert [(e.step, e.actors) for e in events if e.source == "web"] == [(7, 2), (35, 1)]
