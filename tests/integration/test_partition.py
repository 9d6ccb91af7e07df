"""`overlord partition` and `loader.partition: auto` on the real demo corpus: the profile is journaled
and reused, the plan applied by every role; a cluster run with it delivers the same streams as the
config as written, every planned sample once. And `loader.read_ahead_bytes` bounds the read-ahead, which
starts at once or once the row groups asked for are nearly served, by position."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from flight_overlord.config import ConfigError, load_config
from flight_overlord.core.partition_plan import GiB
from flight_overlord.deploy.cli import main
from flight_overlord.deploy.topology import loader_hosts
from flight_overlord.loader.actor import READ_AHEAD_AT, SERVED_KEPT, LoaderActor, read_ahead_phase
from flight_overlord.loader.row_groups import SourceShare

from ..helpers import delivered_keys, fetch_run, journal, write_config

AUTO = {"partition": "auto", "budget": {"cpus": 2, "memory_gib": 2}}


def test_overlord_partition_journals_the_profile_and_plans(corpus, tmp_path, capsys):
    path = write_config(tmp_path, corpus, loader=AUTO)
    main(["partition", str(path)])
    out = capsys.readouterr().out
    assert "partition plan:" in out and "measured now" in out
    assert "recommended `deployment: single_node`" in out  # for a node of the budget's cores and memory
    assert all(name in out for name in ("captions", "longdocs", "code", "docstrings", "manuals", "qa"))
    run_dir = load_config(path).run_dir
    profile = json.loads((run_dir / "partition" / "profile.json").read_text())
    assert [p["name"] for p in profile["sources"]] == [s.name for s in load_config(path).sources]
    assert all(p["seconds_per_sample"] > 0 and p["row_group_bytes"] > 0 for p in profile["sources"])
    cfg = load_config(path)  # loads with the plan applied
    plan = json.loads((run_dir / "partition" / "plan.json").read_text())
    assert {s.name: s.loaders for s in cfg.sources} == {s["name"]: s["actors"] for s in plan["sources"]}
    assert [a for _, actors in loader_hosts(cfg) for a in actors] == [tuple(a) for h in plan["hosts"] for a in h]
    assert len(plan["hosts"]) <= 2 and sum(plan["host_bytes"]) <= 2 * GiB
    main(["partition", str(path), "--cpus", "1"])  # the command line's budget wins; the profile is reused
    out = capsys.readouterr().out
    assert "reused" in out and "budget 1 CPUs" in out and len(load_config(path).loader.groups) == 1


@pytest.mark.parametrize("flags,message", [(["--cpus", "0"], "cpus must be a positive number"),
                                           (["--memory", "-1"], "memory (GiB) must be a positive number"),
                                           (["--memory", "0.01"], "leaves nothing for their actors")])
def test_bad_budgets_are_clear_errors(corpus, tmp_path, flags, message):
    path = write_config(tmp_path, corpus, loader=AUTO)
    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)")):
        main(["partition", str(path), *flags])


def test_budget_keys_are_validated(corpus, tmp_path):
    for loader, message in (({"partition": "sometimes"}, "loader.partition"),
                            ({"budget": {"cpus": -1}}, "loader.budget.cpus"),
                            ({"budget": {"memory": 3}}, "loader.budget.memory"),
                            ({"read_ahead_bytes": -5}, "loader.read_ahead_bytes")):
        with pytest.raises(ConfigError, match=message):
            load_config(write_config(tmp_path / message.replace(".", "-"), corpus, loader=loader))


def test_auto_partition_end_to_end_same_streams_every_sample_once(corpus, tmp_path):
    """A journaled profile in which longdocs' file states do not fit one host: the cluster starts
    with longdocs split in two actors on two hosts, and every rank's stream equals the run of the
    config as written (one actor per source, one process each)."""
    auto = write_config(tmp_path / "auto", corpus, loader=AUTO)
    main(["partition", str(auto)])
    profile_path = load_config(auto).run_dir / "partition" / "profile.json"
    profile = json.loads(profile_path.read_text())
    for p in profile["sources"]:
        # one cost per token, so the cost shares are the weights: a measured cost varies with the machine's
        # load, and longdocs' share could pass one host's and split it for cpu before memory is looked at
        p["seconds_per_sample"] = 1e-4 * p["mean_tokens"]
        if p["name"] == "longdocs":
            p["reader_bytes"] = 1.5 * GiB  # as if it had thousands of files
    profile_path.write_text(json.dumps(profile))
    (load_config(auto).run_dir / "partition" / "plan.json").unlink()
    steps = 8
    got = fetch_run(auto, steps)  # LocalCluster plans at start-up, reusing the journaled profile
    cfg = load_config(auto)
    assert cfg.source("longdocs").loaders == 2 and len(cfg.loader.groups) == 2
    hosts_of = {h for h, group in enumerate(cfg.loader.groups) for s, _ in group if s == "longdocs"}
    assert len(hosts_of) == 2
    assert "memory:" in " ".join(r for s in json.loads((cfg.run_dir / "partition" / "plan.json").read_text())["sources"]
                                 for r in s["reasons"])
    planned = [k for record in journal(auto)[:steps] for b in record["bins"] for k in b]
    delivered = [k for tables in got.values() for k in delivered_keys(tables)]
    assert sorted(delivered) == sorted(planned) and len(set(delivered)) == len(delivered)
    reference = fetch_run(write_config(tmp_path / "manual", corpus), steps)
    assert {r: [delivered_keys([t]) for t in tables] for r, tables in got.items()} == \
        {r: [delivered_keys([t]) for t in tables] for r, tables in reference.items()}


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
        for position in range(3):  # asked for, a row group is read whatever the bound; the same samples
            rg = free._at(position)
            assert bounded._at(position) == rg
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
def test_read_ahead_of_each_position_starts_at_its_share_of_the_rows_asked_for(corpus, tmp_path, source):
    """The row groups the Planner asked for (a shuffle window: rows drawn interleaved) hold the next
    steps' rows: of the ones after them, every other position is read at once, the others once 90 %
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
        # read in order: a position at once only if every one before it is (3 waits behind a late 2)
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
    """About half the actors of many sources read their even positions at once, half their odd ones
    (and the test above sees both phases)."""
    assert 30 <= sum(read_ahead_phase(f"src{i:03d}", 0) for i in range(96)) <= 66
    assert read_ahead_phase("longdocs", 0) != read_ahead_phase("docstrings", 0)


def test_served_tables_kept_are_bounded_and_a_retry_past_them_gets_the_same_samples(corpus, tmp_path):
    """A loader keeps a few served tables for retries, not one per fetch; a retry of an older fetch is
    rebuilt from the (compact) buffer: the same rows, the tokenizer's int32 ids."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flight_overlord.transforms import make_transform
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
        for position in range(2):
            rg = whole._at(position)
            assert sampled.metadata(0, rg.file, rg.row_group).equals(whole.metadata(0, rg.file, rg.row_group))
            rows = [[0, rg.file, rg.row_group, row] for row in (rg.num_rows - 1, 0, rg.num_rows // 2)]
            got = sampled.samples(position, 0, rows)
            assert got.equals(whole.samples(position, 0, rows)) and got.num_rows == 3
            held = sampled._buffer[position]
            assert held.tokens is None and held.nbytes == 4 * rg.num_rows < whole._buffer[position].nbytes
    finally:
        for actor in actors:
            actor.close()


def test_sample_level_run_delivers_the_same_streams_every_sample_once(corpus, tmp_path):
    """A cluster whose loaders buffer every row group sample-level (a 1-byte bound): every rank's
    stream (keys, token ids, every column) equals the whole-row-group run's; each planned sample once."""
    steps = 6
    sampled_path = write_config(tmp_path / "sampled", corpus, loader={"sample_level_bytes": 1})
    sampled = fetch_run(sampled_path, steps)
    whole = fetch_run(write_config(tmp_path / "whole", corpus), steps)
    assert {r: [t.to_pydict() for t in tables] for r, tables in sampled.items()} == \
        {r: [t.to_pydict() for t in tables] for r, tables in whole.items()}
    planned = [k for record in journal(sampled_path)[:steps] for b in record["bins"] for k in b]
    delivered = [k for tables in sampled.values() for k in delivered_keys(tables)]
    assert sorted(delivered) == sorted(planned) and len(set(delivered)) == len(delivered)
