"""End to end, on real Flight servers over loopback and real Parquet files."""
from __future__ import annotations

import collections
import threading

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest

from flight_overlord import wire
from flight_overlord.client import StepFetcher
from flight_overlord.config import ConfigError, load_config
from flight_overlord.core.cost import config_cost
from flight_overlord.core.order import epoch_order
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.loader.row_groups import read_catalog
from flight_overlord.wire.schemas import MICROBATCH, load_schema
from flight_overlord.wire.server import connect

from ..helpers import STEPS, WEIGHTS, delivered_keys, fetch_run, journal, sample_lengths, write_config


@pytest.fixture(scope="module")
def main_run(corpus, tmp_path_factory):
    path = write_config(tmp_path_factory.mktemp("main"), corpus, loaders={"captions": 2})
    return path, fetch_run(path)


def test_every_planned_sample_reaches_exactly_one_rank(main_run):
    path, run = main_run
    planned = [k for record in journal(path)[:STEPS] for b in record["bins"] for k in b]
    delivered = [k for r in run for k in delivered_keys(run[r])]
    assert len(planned) > 100
    assert collections.Counter(delivered) == collections.Counter(planned)
    assert len(set(delivered)) == len(delivered), "a sample was delivered twice"
    per_rank = [set(delivered_keys(run[r])) for r in run]
    assert not per_rank[0] & per_rank[1]


def test_realized_mixture_converges_to_weights(main_run):
    _, run = main_run
    tokens = collections.Counter()
    for r in run:
        for key, n in sample_lengths(run[r]):
            tokens[key.split(":")[0]] += n
    total = sum(tokens.values())
    for source, weight in WEIGHTS.items():
        assert abs(tokens[source] / total - weight) < 0.03, (source, tokens[source] / total, weight)


def test_packing_respects_context_and_sample_boundaries(main_run, corpus):
    path, run = main_run
    cfg = load_config(path)
    L = cfg.global_batch.context_length
    texts = {}
    for r in run:
        for t in run[r]:
            assert t.schema.equals(load_schema(MICROBATCH))
            for row in t.to_pylist():
                ids, pos, cu = np.array(row["input_ids"]), np.array(row["position_ids"]), row["cu_seqlens"]
                assert len(ids) == len(pos) == L
                assert cu[0] == 0 and cu[-1] == row["num_tokens"] <= L
                assert len(cu) == len(row["sample_keys"]) + 1
                for key, start, end in zip(row["sample_keys"], cu[:-1], cu[1:]):
                    assert end > start
                    assert (pos[start:end] == np.arange(end - start)).all()
                    texts[key] = ids[start:end]
                assert (pos[row["num_tokens"]:] == 0).all() and (ids[row["num_tokens"]:] == cfg.pad_token_id).all()
    # The tokens are the sample's own bytes: check a spread of keys against the Parquet files.
    for key in sorted(texts)[::25]:
        source, file, rg, row = key.split(":")
        text = pq.ParquetFile(corpus / file).read_row_group(int(rg), columns=["text"]).column(0)[int(row)].as_py()
        assert texts[key].tolist() == list(text.encode()[:L]), key


def test_balancing_lowers_rank_imbalance(main_run):
    path, run = main_run
    cfg = load_config(path)
    records = journal(path)[:STEPS]
    balanced = [r["stats"]["imbalance"] for r in records]
    unbalanced = [r["stats"]["imbalance_unbalanced"] for r in records]
    assert np.mean(balanced) < np.mean(unbalanced)
    assert np.mean(balanced) < 1.1
    # The planner's figure is what the ranks really received.
    for step in range(STEPS):
        cost = config_cost(cfg.cost)
        costs = [cost({"num_tokens": np.array([n for _, n in sample_lengths([run[r][step]])])}).sum() for r in run]
        assert np.isclose(max(costs) / np.mean(costs), balanced[step])


def test_same_seed_same_stream_whatever_the_loader_count(main_run, corpus, tmp_path):
    path, run = main_run
    again = fetch_run(write_config(tmp_path / "again", corpus, loaders={"captions": 2}), steps=6)
    other_actors = fetch_run(write_config(tmp_path / "actors", corpus, loaders={"captions": 3, "code": 2, "qa": 2}),
                             steps=6)
    for r in run:
        for step in range(6):
            expected = run[r][step].select(["sample_keys", "input_ids", "position_ids", "cu_seqlens"])
            assert again[r][step].select(expected.column_names).equals(expected)
            assert other_actors[r][step].select(expected.column_names).equals(expected)


def test_different_seed_different_stream(main_run, corpus, tmp_path):
    _, run = main_run
    other = fetch_run(write_config(tmp_path / "seed", corpus, loaders={"captions": 2}, seed=8), steps=2)
    assert delivered_keys(other[0]) != delivered_keys(run[0][:2])


def test_stock_flight_client_follows_the_planner_endpoint(idle_cluster):
    client = fl.connect(idle_cluster.planner)  # reads step 0 only: the shared cluster stays idle
    info = client.get_flight_info(fl.FlightDescriptor.for_path("batch", "0", "1"))
    assert info.schema.equals(load_schema(MICROBATCH))
    listed = [f.descriptor.path for f in client.list_flights()]
    assert [b"batch", b"0", b"1"] in listed and [b"source", b"captions"] in listed
    endpoint = info.endpoints[0]
    table = fl.connect(endpoint.locations[0].uri.decode()).do_get(endpoint.ticket).read_all()
    assert table.num_rows == 2 and set(table.column("bucket").to_pylist()) == {1}
    assert client.get_schema(fl.FlightDescriptor.for_path("batch", "3", "0")).schema.equals(load_schema(MICROBATCH))
    client.close()


def test_a_stock_client_on_rank_streams_gets_the_per_step_stream(main_run, corpus, tmp_path):
    """('rank', RANK, FIRST): one ticket, one do_get of one record batch per step (its step column), the
    same tables as per-step tickets of the same config and seed; asking again from a step already sent
    (a reconnect) resumes there, neither skipping nor repeating."""
    _, per_step = main_run
    path = write_config(tmp_path, corpus, loaders={"captions": 2})
    got: dict[int, list] = {0: [], 1: []}
    errors = []

    def read(rank: int, first: int, count: int) -> None:
        try:
            planner = fl.connect(cluster.planner)
            info = planner.get_flight_info(fl.FlightDescriptor.for_path("rank", str(rank), str(first)))
            assert info.schema.equals(load_schema(MICROBATCH))
            endpoint = info.endpoints[0]
            reader = fl.connect(endpoint.locations[0].uri.decode()).do_get(endpoint.ticket)
            for step in range(first, first + count):
                batch = reader.read_chunk().data
                assert set(batch.column("step").to_pylist()) == {step}
                got[rank][step:] = [pa.Table.from_batches([batch])]
            reader.cancel()
            planner.close()
        except BaseException as exc:  # surfaced in the test's thread
            errors.append(exc)

    with LocalCluster(path) as cluster:
        for rounds in ([(0, 0, 8), (1, 0, 8)], [(0, 5, STEPS - 5), (1, 8, STEPS - 8)]):
            threads = [threading.Thread(target=read, args=args) for args in rounds]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            assert not errors, errors[0]
    for rank in (0, 1):
        assert len(got[rank]) == STEPS
        for step in range(STEPS):
            assert got[rank][step].equals(per_step[rank][step].combine_chunks()), (rank, step)


def test_bad_requests_get_clear_errors_and_servers_stay_up(corpus, tmp_path):
    path = write_config(tmp_path, corpus)
    with LocalCluster(path) as cluster:
        # register and a loader's samples are internal calls: these clients carry the run's secret
        planner = connect(cluster.planner, cluster.credentials)
        info = planner.get_flight_info(fl.FlightDescriptor.for_path("batch", "0", "0"))
        constructor = fl.connect(info.endpoints[0].locations[0].uri.decode())
        source_info = planner.get_flight_info(fl.FlightDescriptor.for_path("source", "captions"))
        loader = connect(source_info.endpoints[0].locations[0].uri.decode(), cluster.credentials)
        buffered = loader.do_get(source_info.endpoints[0].ticket).read_all()
        assert buffered.num_rows > 0 and all(k.startswith("captions:") for k in buffered.column("key").to_pylist())

        with pytest.raises(fl.FlightServerError, match="invalid request: .*malformed ticket"):
            constructor.do_get(fl.Ticket(b"not json")).read_all()
        with pytest.raises(fl.FlightServerError, match="invalid request: .*field 'step'"):
            constructor.do_get(wire.ticket({"kind": "batch", "rank": 0})).read_all()
        with pytest.raises(fl.FlightServerError, match="invalid request: .*malformed ticket"):
            loader.do_get(wire.ticket({"kind": "nope"})).read_all()
        with pytest.raises(fl.FlightServerError, match="invalid request: .*is not \\[epoch, file, row_group, row\\]"):
            loader.do_get(wire.ticket({"kind": "samples", "source": "captions", "actor": 0, "step": 0, "constructor": 0,
                                       "samples": [[1]]})).read_all()  # (a host of several actors needs their name)
        # A constructor asks for all the actors a loader process hosts in one call ("parts"): the same
        # rows as one call per actor, back to back (asked at far steps: serving is a function of the request).
        hosted = collections.defaultdict(list)
        for key in loader.do_get(wire.ticket({"kind": "buffer"})).read_all().column("key").to_pylist():
            source, file, group, row = key.rsplit(":", 3)
            hosted[source].append([0, file, int(group), int(row)])
        parts = [{"source": s, "actor": 0, "samples": rows[:3]} for s, rows in sorted(hosted.items())]
        assert len(parts) >= 2
        one_by_one = [loader.do_get(wire.ticket({"kind": "samples", "step": 10 ** 6, "constructor": 0, **p})).read_all()
                      for p in parts]
        merged = loader.do_get(wire.ticket({"kind": "samples", "step": 10 ** 6 + 1, "constructor": 0,
                                            "parts": parts})).read_all()
        assert merged.column("key").to_pylist() == [k for t in one_by_one for k in t.column("key").to_pylist()]
        assert merged.column("tokens").to_pylist() == [x for t in one_by_one for x in t.column("tokens").to_pylist()]
        with pytest.raises(fl.FlightServerError, match="invalid request: .*parts .* is not a non-empty list"):
            loader.do_get(wire.ticket({"kind": "samples", "step": 0, "constructor": 0, "parts": []})).read_all()
        with pytest.raises(fl.FlightServerError, match="not found: .*nope\\[0\\] is not hosted here"):
            loader.do_get(wire.ticket({"kind": "samples", "step": 0, "constructor": 0,
                                       "parts": [{"source": "nope", "actor": 0, "samples": []}]})).read_all()
        with pytest.raises(fl.FlightServerError, match="not found: .*unknown descriptor"):
            planner.get_flight_info(fl.FlightDescriptor.for_path("nope"))
        with pytest.raises(fl.FlightServerError, match="invalid request: .*rank 99 is outside the mesh"):
            planner.get_flight_info(fl.FlightDescriptor.for_path("batch", "0", "99"))
        with pytest.raises(fl.FlightServerError, match="invalid request: .*step and rank must be integers"):
            planner.get_flight_info(fl.FlightDescriptor.for_path("batch", "x", "0"))
        with pytest.raises(fl.FlightServerError, match="invalid request: .*rank, first and end step must be integers"):
            planner.get_flight_info(fl.FlightDescriptor.for_path("rank", "0", "x"))
        with pytest.raises(fl.FlightServerError, match="invalid request: .*a rank stream is \\('rank', RANK"):
            planner.get_flight_info(fl.FlightDescriptor.for_path("rank"))
        with pytest.raises(fl.FlightUnauthorizedError, match="signature does not match"):
            forged = wire.ticket({"kind": "rank", "step": 0, "rank": 0, "exp": 2 ** 40, "sig": "f"})
            constructor.do_get(forged).read_all()
        with pytest.raises(fl.FlightServerError, match="not found: .*unknown action 'explode'"):
            wire.call(planner, "explode")
        with pytest.raises(fl.FlightServerError, match="invalid request: .*malformed body"):
            list(planner.do_action(fl.Action("register", b"[1,2")))

        # Everyone is still up and the data still flows.
        assert wire.call(planner, "status")["ready"]
        fetcher = StepFetcher(cluster.planner, 0, timeout=60)
        assert fetcher.fetch(0).num_rows == 2 and fetcher.fetch(1).num_rows == 2
        fetcher.close()
        assert all(c.process.poll() is None for c in cluster.children)


def _copy_corpus(corpus, tmp_path):
    import shutil
    root = tmp_path / "corpus"
    shutil.copytree(corpus, root)
    return root


def test_unreadable_parquet_file_is_named_at_start(corpus, tmp_path):
    root = _copy_corpus(corpus, tmp_path)
    bad = sorted((root / "qa").glob("*.parquet"))[0]
    bad.write_bytes(b"this is not parquet at all")
    cluster = LocalCluster(write_config(tmp_path, root))
    with pytest.raises(ConfigError, match=f"source 'qa': cannot read Parquet file {bad}"):
        cluster.start()  # named before any role starts (the check of the sources' files)
    assert not cluster.children


def test_missing_column_is_named_at_start(corpus, tmp_path):
    root = _copy_corpus(corpus, tmp_path)
    path = sorted((root / "code").glob("*.parquet"))[0]
    pq.write_table(pq.read_table(path).rename_columns(["body", "doc_id"]), path)
    cluster = LocalCluster(write_config(tmp_path, root))
    with pytest.raises(ConfigError, match=f"source 'code': file {path} has no column 'text'"):
        cluster.start()  # the check before any role starts reads the first file's schema
    assert not cluster.children


def test_corrupt_row_group_is_skipped_and_the_run_goes_on(corpus, tmp_path):
    root = _copy_corpus(corpus, tmp_path)
    config = write_config(tmp_path, root)
    source = load_config(config).source("captions")
    # Corrupt the data pages (not the footer) of the row group read first.
    first = epoch_order(read_catalog(source), seed=7, source="captions", epoch=0)[0]
    path = root / first.file
    column = pq.read_metadata(path).row_group(first.row_group).column(0)
    raw = bytearray(path.read_bytes())
    start = column.data_page_offset
    raw[start + 8:start + column.total_compressed_size - 8] = b"\xff" * (column.total_compressed_size - 16)
    path.write_bytes(bytes(raw))
    run = fetch_run(config, steps=STEPS)
    keys = {k for r in run for k in delivered_keys(run[r])}
    assert any(k.startswith("captions:") for k in keys)
    assert not any(k.startswith(f"captions:{first.file}:{first.row_group}:") for k in keys)
    assert journal(config)[STEPS - 1]["stats"]["skipped"] == first.num_rows
