"""Their corpus as it is: a pre-tokenized Parquet source with a loss mask, a Hugging Face ``datasets``
folder (IPC stream files), a Feather file, JSON Lines (zstd) made Parquet by ``overlord convert`` and a
Megatron indexed dataset, in one run through ``TrainerClient``. Every delivered sample holds its file's row
(its tokens; for the pre-tokenized one, labels only where the mask trains), a kill -9 of two loaders changes no rank's
stream (every column of every step), and ``overlord audit`` counts every sample once."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from flight_overlord import harness
from flight_overlord.config import load_config

from ..corpora import (
    convert,
    row_of,
    write_feather,
    write_hf_datasets,
    write_jsonl_zst,
    write_megatron,
    write_pretokenized,
)
from ..helpers import write_config
from .test_recovery import run_killing

STEPS = 24
CONTEXT = 1024


@pytest.fixture(scope="module")
def their_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("their_corpus")
    write_pretokenized(root / "sft")
    write_hf_datasets(root / "hf")
    write_feather(root / "feather" / "part.feather")
    write_jsonl_zst(root / "raw" / "dump.jsonl.zst")
    convert([root / "raw" / "dump.jsonl.zst"], root / "jsonl", "--row-group-bytes", "4096")
    write_megatron(root / "megatron" / "corpus_text_document", sequences=1200)
    return root


def config(directory, root):
    return write_config(directory, root, loader={"hosts": 0}, checkpoint={"every": 8}, sources=[
        {"name": "sft", "paths": "sft/*.parquet", "tokens_column": "input_ids", "loss_mask_column": "loss_mask",
         "weight": 0.4},
        {"name": "hf", "paths": "hf", "weight": 0.3},  # the folder: state.json names its files
        {"name": "jsonl", "paths": "jsonl/*.parquet", "weight": 0.2},
        {"name": "feather", "paths": "feather/*.feather", "weight": 0.1},
        {"name": "megatron", "paths": "megatron/*.bin", "tokens_column": "input_ids", "weight": 0.1}])


def drive_keeping(tables: dict | None):
    """A ``run_killing`` drive: every rank through TrainerClient, each step digested whole (every column:
    labels and loss masks too); ``tables``: rank -> the tables, kept for a look at their content."""
    def drive(planner, on_step):
        def on_table(rank, client, table):
            step = table.column("step")[0].as_py()
            on_step(rank, step)
            if tables is not None:
                tables.setdefault(rank, []).append(table)
            return step, harness.table_digest(table)
        return harness.train(planner, 2, 0, STEPS, on_table=on_table)
    return drive


@pytest.fixture(scope="module")
def reference(their_corpus, tmp_path_factory):
    tables: dict = {}
    streams = run_killing(config(tmp_path_factory.mktemp("reference"), their_corpus), {}, drive_keeping(tables))
    return streams, tables


def test_every_sample_holds_its_row_whatever_the_format(reference, their_corpus):
    _, tables = reference
    seen = set()
    for table in (t for rank in tables.values() for t in rank):
        for mb in table.to_pylist():
            ids, labels, mask = (np.array(mb[c]) for c in ("input_ids", "labels", "loss_mask"))
            assert mask.tolist() == (labels != -100).astype(int).tolist()
            for key, start, end in zip(mb["sample_keys"], mb["cu_seqlens"][:-1], mb["cu_seqlens"][1:]):
                source = key.split(":", 1)[0]
                seen.add(source)
                if source == "sft":
                    row = row_of(their_corpus, key, ["input_ids", "loss_mask"])
                    want, trained = np.array(row["input_ids"]), np.array(row["loss_mask"])
                elif source == "megatron":
                    want, trained = np.array(row_of(their_corpus, key, ["input_ids"])["input_ids"]), None
                else:
                    want, trained = np.frombuffer(row_of(their_corpus, key, ["text"])["text"].encode(), np.uint8), None
                n = end - start
                assert 0 < n <= CONTEXT and ids[start:end].tolist() == want[:n].tolist(), key
                targets = want[1:n].astype(np.int64)
                if trained is not None:  # the label of token j is token j+1, where token j+1 is trained
                    targets = np.where(trained[1:n] != 0, targets, -100)
                assert labels[start:end - 1].tolist() == targets.tolist() and labels[end - 1] == -100, key
    assert seen == {"sft", "hf", "jsonl", "feather", "megatron"}
    sft_masks = [row_of(their_corpus, k, ["loss_mask"])["loss_mask"] for t in tables[0] for keys in
                 t.column("sample_keys").to_pylist() for k in keys if k.startswith("sft:")]
    assert any(0 in m[1:] for m in sft_masks), "no prompt token among the delivered samples: the mask went untested"


def test_kill_9_of_their_loaders_changes_no_stream_and_audit_counts_each_sample_once(reference, their_corpus,
                                                                                      tmp_path):
    streams, tables = reference
    path = config(tmp_path, their_corpus)
    assert run_killing(path, {7: "loader-hf-0", 13: "loader-sft-0"}, drive_keeping(None)) == streams
    audit = subprocess.run([sys.executable, "-m", "flight_overlord.deploy.cli", "audit",
                            str(load_config(path).run_dir), "--json"], capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stderr
    report = json.loads(audit.stdout)
    delivered = sum(len(keys) for rank in tables.values() for t in rank for keys in t.column("sample_keys").to_pylist())
    assert (report["samples"], report["duplicates"], report["missing"]) == (delivered, 0, 0)
    assert set(report["per_source"]) == {"sft", "hf", "jsonl", "feather", "megatron"}
