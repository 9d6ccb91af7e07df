"""Pure logic: read order, mixing, packing, mesh, transforms, config validation."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flight_overlord.config import ConfigError, load_config, parse_config
from flight_overlord.core.mesh import Mesh
from flight_overlord.core.mixing import Mixer
from flight_overlord.core.order import RowGroupRef, epoch_order, owned_row_groups
from flight_overlord.core.packing import pack
from flight_overlord.planner.feed import SourceFeed
from flight_overlord.transforms import make_transform

from ..helpers import write_config

CATALOG = [RowGroupRef(f"f{f}.parquet", g, 5 + g) for f in range(3) for g in range(4)]


def test_actor_orders_are_the_global_order_restricted():
    for actors in (1, 2, 3, 5):
        global_order = epoch_order(CATALOG, seed=3, source="s", epoch=2)
        owned = [owned_row_groups(CATALOG, a, actors) for a in range(actors)]
        assert sorted(rg for part in owned for rg in part) == sorted(CATALOG)  # a partition
        for part in owned:
            assert epoch_order(part, seed=3, source="s", epoch=2) == [rg for rg in global_order if rg in part]


def _stream(seed: int, n: int, catalog=CATALOG) -> list:
    full = {"num_tokens": np.ones(100, dtype=np.int64)}
    feed = SourceFeed("s", catalog, seed, lambda epoch, rg: full)
    return [feed.next().ref for _ in range(n)]


def test_source_stream_is_seeded_and_visits_every_row_once_per_epoch():
    rows = sum(rg.num_rows for rg in CATALOG)
    first = _stream(1, 2 * rows)
    assert first == _stream(1, 2 * rows)
    assert first != _stream(2, 2 * rows)
    epoch0, epoch1 = first[:rows], first[rows:]
    assert len({r.key for r in epoch0}) == rows and {r.epoch for r in epoch0} == {0}
    assert {r.key for r in epoch1} == {r.key for r in epoch0} and [r.key for r in epoch1] != [r.key for r in epoch0]


def test_feed_state_round_trips_mid_row_group_with_a_backlog():
    full = {"num_tokens": np.ones(100, dtype=np.int64)}
    reference = _stream(4, 120)
    feed = SourceFeed("s", CATALOG, 4, lambda epoch, rg: full)
    head = [feed.next() for _ in range(37)]
    feed.defer(head[-3:])  # three drawn samples given back: they come first again
    state = feed.state_dict()
    restored = SourceFeed("s", CATALOG, 4, lambda epoch, rg: full)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    rest = [restored.next().ref for _ in range(120 - 34)]
    assert [p.ref for p in head[:34]] + rest == reference


def test_mixer_tracks_weights_within_one_sample_at_every_point():
    mixer = Mixer(["a", "b", "c"])
    weights = {"a": 0.5, "b": 0.3, "c": 0.2}
    for n in range(1, 1001):
        mixer.charge(mixer.choose(weights), 1, weights)
        assert np.all(np.abs(mixer.realized - n * np.array([0.5, 0.3, 0.2])) < 1.0)


def test_mixer_refund_undoes_a_charge():
    mixer = Mixer(["a", "b"])
    weights = {"a": 1.0, "b": 3.0}
    mixer.charge("a", 100, weights)
    before = mixer.state_dict()
    mixer.charge("b", 7, weights)
    mixer.refund("b", 7, weights)
    assert np.allclose(mixer.state_dict()["credit"], before["credit"])
    with pytest.raises(ValueError, match="positive sum"):
        mixer.choose({"a": 0, "b": 0})


def test_pack_positions_restart_and_cu_seqlens_mark_boundaries():
    p = pack([np.array([5, 6, 7]), np.array([8]), np.array([9, 9])], 8, pad_token_id=1)
    assert p.input_ids.tolist() == [5, 6, 7, 8, 9, 9, 1, 1]
    assert p.position_ids.tolist() == [0, 1, 2, 0, 0, 1, 0, 0]
    assert p.cu_seqlens.tolist() == [0, 3, 4, 6] and p.num_tokens == 6
    with pytest.raises(ValueError, match="more than the context length 4"):
        pack([np.arange(5)], 4)


def test_mesh_rank_coordinates_round_trip_in_megatron_order():
    for shape in [(1, 4, 1, 1), (2, 2, 1, 2), (3, 2, 2, 2)]:
        mesh = Mesh(*shape)
        coords = [mesh.coord(r) for r in range(mesh.world_size)]
        assert [mesh.rank(c) for c in coords] == list(range(mesh.world_size))
        assert len(set(coords)) == mesh.world_size
    mesh = Mesh(pp=1, dp=2, cp=1, tp=2)
    assert [mesh.coord(r).tp for r in range(4)] == [0, 1, 0, 1]  # tp varies fastest
    assert [mesh.coord(r).dp for r in range(4)] == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="rank 4 is outside the mesh"):
        mesh.coord(4)
    grouped = Mesh(dp=5, dp_per_constructor=2)
    assert grouped.num_constructors == 3 and list(grouped.dp_ranks_of(2)) == [4]


def test_byte_tokenizer_is_utf8_bytes_truncated():
    tokenize = make_transform("byte_tokenizer")
    out = tokenize(pa.array(["héllo", None, "abc"]).slice(0), 4)
    assert out.to_pylist() == [list("héllo".encode()[:4]), [], [97, 98, 99]]
    with pytest.raises(KeyError, match="unknown transform 'nope'"):
        make_transform("nope")


def test_config_loads_and_resolves_globs(corpus, tmp_path):
    cfg = load_config(write_config(tmp_path, corpus, loaders={"qa": 3}))
    qa = cfg.source("qa")
    assert qa.loaders == 3 and len(qa.files) >= 2 and all(Path(f).exists() for f in qa.files)
    assert qa.file_ids[0].startswith("qa/")
    assert cfg.mesh == Mesh(dp=2) and cfg.num_constructors == 2


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.update(bogus=1), "unknown key 'bogus'"),
    (lambda r: r["sources"][0].update(weight=-1), r"sources\[0\]\.weight: must be >= 0.0"),
    (lambda r: r["sources"][1].update(paths="nowhere/*.parquet"), "no file matches the glob: .*nowhere"),
    (lambda r: r["sources"][1].update(paths="missing.parquet"), "file not found: .*missing.parquet"),
    (lambda r: r["sources"][2].update(colour="red"), r"unknown key 'sources\[2\]\.colour'"),
    (lambda r: r["global_batch"].pop("context_length"), "missing required key 'global_batch.context_length'"),
    (lambda r: r["global_batch"].update(samples_per_step=4), "exactly one of 'samples_per_step' or 'tokens_per_step'"),
    (lambda r: r.update(mesh={"dp": 0}), "mesh.dp: must be >= 1"),
    (lambda r: r.update(balance={"method": "magic"}), "balance.method: 'magic' is not one of"),
    (lambda r: r["sources"][1].update(name=r["sources"][0]["name"]), "duplicate source name"),
    (lambda r: r.update(sources=[]), "non-empty list"),
])
def test_invalid_config_names_what_is_wrong(corpus, tmp_path, mutate, message):
    import yaml
    raw = yaml.safe_load(write_config(tmp_path, corpus).read_text())
    mutate(raw)
    with pytest.raises(ConfigError, match=message):
        parse_config(raw, base_dir=Path(tmp_path))


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
