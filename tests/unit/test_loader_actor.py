"""One loader actor (``loader/actor.py``) in this process, over real Parquet files: its read-ahead (the
byte bound, the share of the asked-for rows served before a slot is read ahead, the phases), the
served tables kept for retries, sample-level row groups, and a take-over after a live reshard."""
from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flight_overlord.config import load_config
from flight_overlord.config.parse import parse_config
from flight_overlord.core.scaling import Ownership
from flight_overlord.loader.actor import READ_AHEAD_AT, SERVED_KEPT, LoaderActor, read_ahead_phase
from flight_overlord.loader.row_groups import SourceShare
from flight_overlord.transforms import make_transform

from ..helpers import write_config


def _buffered_after(cfg, run_dir: Path, **bound) -> LoaderActor:
    actor = LoaderActor(SourceShare(cfg.source("longdocs"), 0, cfg.global_batch.context_length, cfg.vision),
                        seed=cfg.seed, read_ahead=4, run_dir=run_dir, **bound)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(actor._buffer) < (1 if bound else 4):
        time.sleep(0.05)
    time.sleep(0.3)  # it would have read more by now
    return actor


def test_read_ahead_bytes_bounds_the_buffer_and_changes_no_sample(corpus, tmp_path):
    cfg = load_config(write_config(tmp_path, corpus))
    free = _buffered_after(cfg, tmp_path / "free")
    bounded = _buffered_after(cfg, tmp_path / "bounded", read_ahead_bytes=1)
    try:
        assert len(free._buffer) == 4 and len(bounded._buffer) == 1  # 1 byte: no row group read ahead of another
        for slot in range(3):  # asked for, a row group is read whatever the bound; the same samples
            rg = free._at(slot)
            assert bounded._at(slot) == rg
            assert bounded.metadata(0, rg.file, rg.row_group).equals(free.metadata(0, rg.file, rg.row_group))
    finally:
        free.close()
        bounded.close()


def _wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not condition():
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize("source", ["longdocs", "docstrings"])  # the two phases (read_ahead_phase)
def test_read_ahead_of_each_slot_starts_at_its_share_of_the_rows_asked_for(corpus, tmp_path, source):
    """The row groups the Planner asked for (a shuffle window: rows drawn interleaved) hold the next
    steps' rows: of the ones after them, every other slot is read at once, the others once 90 %
    of those rows are served, still before they are asked for. Which comes first is the actor's phase:
    at start-up some actors hold the next row group already and some do not (not all in phase)."""
    cfg = load_config(write_config(tmp_path, corpus))
    actor = LoaderActor(SourceShare(cfg.source(source), 0, cfg.global_batch.context_length, cfg.vision),
                        seed=cfg.seed, read_ahead=2, run_dir=tmp_path / "run")
    try:
        assert _wait_for(lambda: sorted(actor._buffer) == [0, 1])  # start-up: nothing asked yet, read ahead at once
        window = [actor._at(0), actor._at(1)]
        for rg in window:
            actor.metadata(0, rg.file, rg.row_group)
        at_once = [p for p in (2, 3) if actor.read_ahead_at(p) == 0]
        assert at_once == ([2] if read_ahead_phase(source, 0) == 0 else [3])
        interleaved = [[0, rg.file, rg.row_group, row] for row in range(max(rg.num_rows for rg in window))
                       for rg in window if row < rg.num_rows]
        late = -(-int(max(READ_AHEAD_AT) * 1000) * len(interleaved) // 1000)  # rows to serve before the other
        assert 1 < late < len(interleaved)
        # read in order: a slot at once only if every one before it is (3 waits behind a late 2)
        expected = [0, 1, 2] if at_once == [2] else [0, 1]
        assert _wait_for(lambda: sorted(actor._buffer) == expected)
        for step, wanted in enumerate(interleaved[:late - 1]):
            actor.samples(step, 0, [wanted])
        time.sleep(0.6)  # every fetch gave the read-ahead a turn (ReadAheadPool.poke): it still waits
        assert sorted(actor._buffer) == expected
        for step, wanted in enumerate(interleaved[late - 1:], start=late):
            actor.samples(step, 0, [wanted])
        assert _wait_for(lambda: {2, 3} <= set(actor._buffer))  # (0 may be served whole by now, and gone)
        assert actor.state.demanded == 1  # read before the Planner asked for them
    finally:
        actor.close()


def test_read_ahead_phases_split_the_actors():
    """About half the actors of many sources read their even slots at once, half their odd ones
    (and the test above sees both phases)."""
    assert 30 <= sum(read_ahead_phase(f"src{i:03d}", 0) for i in range(96)) <= 66
    assert read_ahead_phase("longdocs", 0) != read_ahead_phase("docstrings", 0)


def test_served_tables_kept_are_bounded_and_a_retry_past_them_gets_the_same_samples(corpus, tmp_path):
    """A loader keeps a few served tables for retries, not one per fetch; a retry of an older fetch is
    rebuilt from the (compact) buffer: the same rows, the tokenizer's int32 ids."""
    cfg = load_config(write_config(tmp_path, corpus))
    source = cfg.source("longdocs")
    actor = LoaderActor(SourceShare(source, 0, cfg.global_batch.context_length, cfg.vision), seed=cfg.seed,
                        read_ahead=1, run_dir=tmp_path / "run")
    try:
        rg = actor._at(0)
        asked = [[[0, rg.file, rg.row_group, step % rg.num_rows]] for step in range(10 * SERVED_KEPT)]
        served = [actor.samples(step, 0, wanted) for step, wanted in enumerate(asked)]
        assert len(actor._served) <= SERVED_KEPT
        assert actor.samples(0, 0, asked[0]).equals(served[0])  # evicted long ago: rebuilt, equal
        path = next(p for p, f in zip(source.files, source.file_ids) if f == rg.file)
        text = pq.ParquetFile(path).read_row_group(rg.row_group, columns=[source.text_column]).column(0)
        expected = make_transform("byte_tokenizer")(text.combine_chunks(), cfg.global_batch.context_length)
        assert served[0].schema.field("tokens").type == pa.list_(pa.int32())
        assert served[0].column("tokens").to_pylist() == [expected[0].as_py()]
    finally:
        actor.close()


def test_sample_level_rows_are_the_row_group_paths_and_the_buffer_keeps_only_counts(corpus, tmp_path):
    """``loader.sample_level_bytes``: a row group over the bound is buffered as its token counts; the
    Planner's metadata and every served sample are those of the whole-row-group path."""
    cfg = load_config(write_config(tmp_path, corpus))
    source = cfg.source("longdocs")
    actors = [LoaderActor(SourceShare(source, 0, cfg.global_batch.context_length, cfg.vision), seed=cfg.seed,
                          read_ahead=1, run_dir=tmp_path / name, sample_level_bytes=bound)
              for name, bound in (("whole", 0), ("sampled", 1))]
    whole, sampled = actors
    try:
        for slot in range(2):
            rg = whole._at(slot)
            assert sampled.metadata(0, rg.file, rg.row_group).equals(whole.metadata(0, rg.file, rg.row_group))
            rows = [[0, rg.file, rg.row_group, row] for row in (rg.num_rows - 1, 0, rg.num_rows // 2)]
            got = sampled.samples(slot, 0, rows)
            assert got.equals(whole.samples(slot, 0, rows)) and got.num_rows == 3
            held = sampled._buffer[slot]
            assert held.tokens is None and held.nbytes == 4 * rg.num_rows < whole._buffer[slot].nbytes
    finally:
        for actor in actors:
            actor.close()


def test_a_loader_actor_takes_over_after_a_reshard_and_restores_it(tmp_path):
    """Two actors of a real Parquet source, the second idle until a reshard: it serves what it owns
    from the boundary on (and nothing else), journals the segments, and a restart of it restores them."""
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
        for g in range(3):  # the feed asked for slots 0..2
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
            added.slot(other // rows, ownership.row_group(other).file, ownership.row_group(other).row_group)
        with pytest.raises(ValueError, match="do not extend"):
            added.reshard([[0, 2], [boundary, 2], [boundary + 5, 1]])
    finally:
        added.close()
    again = actor(1)  # a restart folds the journaled segments in: no ticket needed to find its rows
    try:
        assert again.state.segments == segments
        assert again.slot(epoch, rg.file, rg.row_group) == 0
    finally:
        again.close()
        first.close()
