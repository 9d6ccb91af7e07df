"""distribute('HDP') end to end: a real cluster over a long-tail Parquet source on dp2 x cp2 x tp2,
audited with a stock Flight client: every token of every planned sample delivered exactly once per
DP x CP domain, on the aligned group of ranks its length asks for, and the shards reassemble the
Parquet text; TP ranks after the first get the same rows as metadata only."""
from __future__ import annotations

import collections

import numpy as np
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest

from flight_overlord import harness
from flight_overlord.client import TrainerClient
from flight_overlord.config import load_config
from flight_overlord.core import hdp
from flight_overlord.core.context_parallel import reassemble
from flight_overlord.demo.long_tail import make_long_tail
from flight_overlord.deploy.launch import LocalCluster

from ..helpers import journal, train, write_config

STEPS, PER_RANK = 4, 2048
STRATEGY = f"""
def build(s):
    return s.cost("attention").distribute("HDP", max_tokens_per_rank={PER_RANK}).broadcast_at("TP")
"""


def hdp_config(directory, data, strategy_file, mesh=None, **overrides):
    return write_config(directory, data, sources=[{"name": "longtail", "paths": "longtail/*.parquet", "loaders": 2}],
                        mesh=mesh or {"dp": 2, "cp": 2, "tp": 2},
                        global_batch={"context_length": 8192, "microbatches": 2, "tokens_per_step": 12000},
                        cost={"model": "attention", "a": 1.0, "b": 0.0005},
                        strategy={"file": str(strategy_file)}, **overrides)


@pytest.fixture(scope="module")
def hdp_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("hdp")
    make_long_tail(root / "data", "longtail", rows=800, max_tokens=8192, seed=3, files=2, tail_fraction=0.15)
    (root / "hdp_strategy.py").write_text(STRATEGY)
    path = hdp_config(root, root / "data", root / "hdp_strategy.py")
    cfg = load_config(path)
    with LocalCluster(path) as cluster:
        client = fl.FlightClient(cluster.planner)  # a stock client: descriptor -> endpoint -> do_get
        schema = client.get_schema(fl.FlightDescriptor.for_path("batch", "0", "0")).schema
        assert schema.metadata[b"name"] == b"hdp_microbatch" and "seq_cp_first" in schema.names
        tables = harness.fetch_steps(cluster.planner, cfg.mesh.world_size, 0, STEPS)
        run = {(step, rank): tables[rank][step] for step in range(STEPS) for rank in range(cfg.mesh.world_size)}
        with TrainerClient(cluster.planner, rank=0, start_step=STEPS, num_steps=1) as trainer:
            tensors = next(iter(trainer))
    return cfg, path, run, tensors


def test_every_token_once_per_domain_on_its_group(hdp_run):
    cfg, path, run, _ = hdp_run
    mesh = cfg.mesh
    domain = [r for r in range(mesh.world_size) if mesh.coord(r).tp == 0]  # tp 0: who gets tokens
    assert len(domain) == 4
    records = journal(path)[:STEPS]
    files, groups_seen, longest = {}, collections.Counter(), 0
    for step, record in enumerate(records):
        planned = {k for b in record["bins"] for k in b}
        shares = collections.defaultdict(list)
        for rank in domain:
            table = run[(step, rank)]
            assert table.schema.metadata[b"name"] == b"hdp_microbatch"
            bucket = mesh.bucket_of(rank, "HDP")
            for row in table.to_pylist():
                assert row["bucket"] == bucket
                ids, at = np.array(row["input_ids"]), 0
                for j, key in enumerate(row["sample_keys"]):
                    n = row["cu_local"][j + 1] - row["cu_local"][j]
                    shares[key].append({"m": row["microbatch"], "bucket": bucket, "size": row["seq_cp_size"][j],
                                        "rank": row["seq_cp_rank"][j], "first": row["seq_cp_first"][j],
                                        "ranges": row["token_ranges"][4 * j:4 * j + 4], "ids": ids[at:at + n],
                                        "length": row["cu_seqlens"][j + 1] - row["cu_seqlens"][j],
                                        "slot": row["cu_seqlens_padded"][j + 1] - row["cu_seqlens_padded"][j]})
                    at += n
                assert at == len(ids)
        assert set(shares) == planned  # every planned sample delivered, nothing else
        for key, parts in shares.items():
            size, first, length, slot = parts[0]["size"], parts[0]["first"], parts[0]["length"], parts[0]["slot"]
            # the group rule: `size` ranks, the aligned block [first, first + size), one microbatch, CP ranks in order
            assert len(parts) == size and hdp.is_pow2(size) and first % size == 0
            assert sorted(p["bucket"] for p in parts) == list(range(first, first + size))
            assert {p["m"] for p in parts} == {parts[0]["m"]} and all(p["bucket"] - first == p["rank"] for p in parts)
            # at least its length's group (widen may double it)
            assert size >= hdp.group_sizes([length], 4, PER_RANK)[0]
            # exactly once: the shards' ranges tile the padded sequence, and give back the Parquet text, whole
            assert sum(len(p["ids"]) for p in parts) == slot
            full = reassemble([(p["ids"], p["ranges"]) for p in parts], slot)
            source, file, rg, row = key.split(":")
            if file not in files:
                files[file] = pq.ParquetFile(cfg.data_root / file)
            text = files[file].read_row_group(int(rg), columns=["text"]).column(0)[int(row)].as_py().encode()
            assert full[:length].tolist() == list(text) and (full[length:] == cfg.pad_token_id).all(), key
            groups_seen[size] += 1
            longest = max(longest, length)
        for rank in range(mesh.world_size):  # tp 1: the same rows, metadata only
            if mesh.coord(rank).tp == 1:
                peer = run[(step, rank - 1)]
                table = run[(step, rank)]
                assert table.column("sample_keys").equals(peer.column("sample_keys"))
                assert all(len(x) == 0 for x in table.column("input_ids").to_pylist())
    assert groups_seen[1] > 0 and sum(n for g, n in groups_seen.items() if g > 1) > 0, groups_seen
    assert {k for rec in records for k in rec["stats"]["hdp"]} >= {"step_time", "idle_fraction", "cp_tokens"}
    assert longest > PER_RANK  # samples longer than a rank's capacity arrived whole, on groups


def test_trainer_client_rows_under_hdp(hdp_run):
    _, _, _, microbatches = hdp_run
    assert len(microbatches) == 2
    for mb in microbatches:
        assert mb["input_ids"] is None or len(mb["input_ids"]) == int(mb["cu_local"][-1])
        assert len(mb["seq_cp_size"]) == len(mb["sample_keys"]) == len(mb["cu_seqlens"]) - 1


def test_pipeline_stages_under_hdp_get_their_fields(hdp_run, tmp_path):
    """pp=2 x cp=2 under HDP, read as trainers read: the first stage gets tokens and positions,
    the last labels and loss mask of the same shares (the next tokens of samples held whole), both the
    same keys, boundaries and token ranges."""
    (tmp_path / "hdp_pp.py").write_text('def build(s):\n    return s.cost("attention").distribute("HDP", '
                                        'max_tokens_per_rank=4096)\n')  # 2 ranks x 4096: the longest sample
    path = hdp_config(tmp_path, hdp_run[1].parent / "data", tmp_path / "hdp_pp.py", mesh={"dp": 1, "cp": 2, "pp": 2})
    mesh = load_config(path).mesh
    with LocalCluster(path) as cluster:
        tables = harness.fetch_steps(cluster.planner, mesh.world_size, 0, 2)
        rows = {(step, rank): tables[rank][step] for step in range(2) for rank in range(mesh.world_size)}
    tokens_seen = 0
    for (step, rank), table in rows.items():
        if mesh.coord(rank).pp == 1:
            continue
        last = rows[(step, next(r for r in range(mesh.world_size) if mesh.coord(r).pp == 1
                                and mesh.bucket_of(r, "HDP") == mesh.bucket_of(rank, "HDP")))]
        for name in ("sample_keys", "cu_seqlens", "cu_local", "token_ranges"):
            assert table.column(name).equals(last.column(name)), name
        for first_row, last_row in zip(table.to_pylist(), last.to_pylist()):
            ids, labels, mask = (np.array(first_row["input_ids"]), np.array(last_row["labels"]),
                                 np.array(last_row["loss_mask"]))
            assert len(ids) == len(first_row["position_ids"]) == len(labels) == len(mask) > 0
            assert not first_row["labels"] and not first_row["loss_mask"]
            assert not last_row["input_ids"] and not last_row["position_ids"]
            assert np.array_equal(mask > 0, labels != -100)
            cu = first_row["cu_local"]
            for j, whole in enumerate(size == 1 for size in first_row["seq_cp_size"]):
                n = first_row["cu_seqlens"][j + 1] - first_row["cu_seqlens"][j]
                if whole and n > 1:  # labels[i] is the token after ids[i] in the same sample
                    assert np.array_equal(labels[cu[j]:cu[j] + n - 1], ids[cu[j] + 1:cu[j] + n])
                    tokens_seen += n
    assert tokens_seen > 0



KILL_STEPS = 12


def _hdp_streams(directory, hdp_run, kill: str | None = None, at: int = 0) -> dict[int, list]:
    """Every rank's stream (keys and token hash per step, through TrainerClient) of a fresh run of
    the HDP config, with ``kill`` given SIGKILL when rank 0 reaches step ``at``."""
    root = hdp_run[1].parent
    path = hdp_config(directory, root / "data", root / "hdp_strategy.py", checkpoint={"every": 4})
    with LocalCluster(path) as cluster:
        def on_step(rank: int, step: int) -> None:
            if kill and rank == 0 and step == at:
                cluster.kill(kill)
        streams = train(cluster.planner, 0, KILL_STEPS, ranks=load_config(path).mesh.world_size, on_step=on_step)
        if kill:
            cluster.wait_restarted(kill)
    return streams


@pytest.fixture(scope="module")
def hdp_reference(hdp_run, tmp_path_factory):
    streams = _hdp_streams(tmp_path_factory.mktemp("hdp-reference"), hdp_run)
    assert all(len(steps) == KILL_STEPS for steps in streams.values())
    return streams


@pytest.mark.parametrize("role", ["planner", "constructor-0"])
def test_kill_9_under_hdp_changes_no_rank_stream(hdp_run, hdp_reference, tmp_path, role):
    """The HDP groups live in the plan journal (Planner) and in the constructors' staged shards: a
    kill -9 of either mid-run leaves every rank's stream equal to an undisturbed run's."""
    assert _hdp_streams(tmp_path, hdp_run, kill=role, at=5) == hdp_reference
