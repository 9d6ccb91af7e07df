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
            view = ownership.view(a)
            expected = [rg for e in range(3) for rg in epoch_order(mine, seed=3, source="web", epoch=e)]
            got = [ownership.row_group(view.position(p)) for p in range(3 * len(mine))]
            assert got == expected


def views_partition_the_order(ownership: Ownership, actors: int, positions: int) -> None:
    views = [ownership.view(a) for a in range(actors)]
    for g in range(positions):
        owner = ownership.owner_at(g)
        for a, v in enumerate(views):
            local = v.local(g)
            assert (local is not None) == (a == owner)
            if local is not None:
                assert v.position(local) == g


@pytest.mark.parametrize("cursor, read_ahead", [(0, 2), (7, 2), (22, 1), (29, 3)])
def test_a_reshard_starts_past_every_read_ahead_and_keeps_what_was_read(cursor, read_ahead):
    ownership = Ownership(CATALOG, seed=5, source="code", segments=[[0, 2]])
    old = [ownership.view(a) for a in range(3)]
    # what each actor may have read: its positions up to its demand (every position below the cursor
    # the feed asked for) plus read_ahead more
    read = {a: [v.position(p) for p in range(v.first_local_at(cursor) + read_ahead) if v.position(p) is not None]
            for a, v in enumerate(old)}
    boundary = ownership.boundary(cursor, read_ahead)
    assert all(g < boundary for positions in read.values() for g in positions)
    assert boundary - 1 in {g for positions in read.values() for g in positions} or boundary == cursor
    ownership.extend(boundary, 3)
    new = [ownership.view(a) for a in range(3)]
    for a in range(3):  # what was read keeps its owner and its local number
        for g in read[a]:
            assert new[a].local(g) == old[a].local(g)
    views_partition_the_order(ownership, 3, 5 * R)
    assert {ownership.owner_at(g) for g in range(boundary, boundary + R)} == {0, 1, 2}


def test_scale_down_ends_the_reclaimed_actors_positions():
    ownership = Ownership(CATALOG, seed=5, source="code", segments=[[0, 2]])
    boundary = ownership.boundary(18, 2)
    ownership.extend(boundary, 1)
    views_partition_the_order(ownership, 2, 5 * R)
    reclaimed = ownership.view(1)
    last = reclaimed.first_local_at(boundary)
    assert reclaimed.position(last - 1) < boundary and reclaimed.position(last) is None
    assert reclaimed.owned_per_epoch() == 0 and ownership.view(0).owned_per_epoch() == R


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
    expected = Ownership(catalog, seed=2, source="s", segments=segments).view(1)
    wanted = list(range(0, 4500, 11))
    truth = [expected.position(p) for p in wanted]
    for _ in range(3):
        view = Ownership(catalog, seed=2, source="s", segments=segments).view(1)
        results, threads = {}, []
        for t in range(6):
            def look_up(t=t):
                results[t] = [view.position(p) for p in wanted]
            threads.append(threading.Thread(target=look_up))
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert all(r == truth for r in results.values())


def test_positions_follow_the_seeded_read_order():
    ownership = Ownership(CATALOG, seed=9, source="web", segments=[[0, 1]])
    for epoch in range(3):
        order = epoch_order(CATALOG, seed=9, source="web", epoch=epoch)
        assert [ownership.row_group(epoch * R + i) for i in range(R)] == order
        positions = [ownership.position(epoch, rg.file, rg.row_group) for rg in order]
        assert positions == list(range(epoch * R, (epoch + 1) * R))
    with pytest.raises(KeyError, match="not in source"):
        ownership.position(0, "nope.parquet", 0)


def test_a_loader_actor_takes_over_after_a_reshard_and_restores_it(tmp_path):
    """Two actors of a real Parquet source, the second idle until a reshard: it serves what it owns
    from the boundary on (and nothing else), journals the segments, and a restart of it restores them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flight_overlord.config.parse import parse_config
    from flight_overlord.loader.actor import LoaderActor
    from flight_overlord.loader.row_groups import SourceShare

    pq.write_table(pa.table({"text": [f"row {i} " * (i % 7 + 1) for i in range(48)]}), tmp_path / "s.parquet",
                   row_group_size=4)  # 12 row groups
    cfg = parse_config({"sources": [{"name": "s", "paths": "s.parquet"}], "run_dir": str(tmp_path / "run"),
                        "global_batch": {"context_length": 256, "microbatches": 1, "samples_per_step": 4},
                        "loader": {"scaling": {"enabled": True}}}, base_dir=tmp_path)
    source = cfg.source("s")

    def actor(index: int) -> LoaderActor:
        return LoaderActor(SourceShare(source, index, 256, provisioned=cfg.provisioned_actors(source)), seed=0,
                           read_ahead=1, run_dir=cfg.run_dir)
    first, added = actor(0), actor(1)
    try:
        ownership = Ownership(first.share.catalog, seed=0, source="s", segments=[[0, 1]])
        for g in range(3):  # the feed asked for positions 0..2
            rg = ownership.row_group(g)
            assert first.metadata(0, rg.file, rg.row_group).num_rows == rg.num_rows
        boundary = ownership.boundary(3, 1)
        ownership.extend(boundary, 2)
        segments = ownership.to_list()
        rows = ownership.rows
        mine = next(g for g in range(boundary, 3 * rows) if ownership.owner_at(g) == 1)
        other = next(g for g in range(boundary, 3 * rows) if ownership.owner_at(g) == 0)
        epoch, rg = mine // rows, ownership.row_group(mine)
        assert added.metadata(epoch, rg.file, rg.row_group, segments).num_rows == rg.num_rows
        served = added.samples(0, 0, [[epoch, rg.file, rg.row_group, 1, 1]])
        assert served.column("key").to_pylist() == [f"s:s.parquet:{rg.row_group}:1"]
        with pytest.raises(KeyError, match="not owned"):
            added.position(other // rows, ownership.row_group(other).file, ownership.row_group(other).row_group)
        with pytest.raises(ValueError, match="do not extend"):
            added.reshard([[0, 2], [boundary, 2], [boundary + 5, 1]])
    finally:
        added.close()
    again = actor(1)  # a restart folds the journaled segments in: no ticket needed to find its rows
    try:
        assert again.state.segments == segments
        assert again.position(epoch, rg.file, rg.row_group) == 0
    finally:
        again.close()
        first.close()


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
