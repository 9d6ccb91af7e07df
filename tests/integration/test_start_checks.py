"""Data errors are errors of ``overlord up``, before any role starts, in one line naming the source, the
file and the column; and a start that fails anyway (a later file is wrong) leaves nothing in ``run_dir``
that refuses the retry (no ``--fresh``)."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pyarrow.parquet as pq

from flight_overlord.config import load_config
from flight_overlord.deploy.launch import LocalCluster

from ..helpers import assert_every_planned_sample_once, write_config

CLI = [sys.executable, "-m", "flight_overlord.deploy.cli"]


def qa_config(directory, corpus, **source):
    return write_config(directory, corpus, sources=[{"name": "qa", "paths": "qa/*.parquet", "weight": 1.0, **source}])


def test_a_missing_column_is_one_line_of_up_before_anything_is_written(corpus, tmp_path):
    path = qa_config(tmp_path, corpus, text_column="body")
    first = sorted((corpus / "qa").glob("*.parquet"))[0]
    out = subprocess.run([*CLI, "up", str(path)], capture_output=True, text=True, timeout=60)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert lines == [f"error: source 'qa': file {first} has no column 'body' (columns: text, doc_id)"], lines
    assert not load_config(path).run_dir.exists()  # nothing to refuse a retry (the next test retries one)


def test_a_start_that_fails_in_a_role_leaves_nothing_that_refuses_the_retry(corpus, tmp_path):
    root = tmp_path / "corpus"
    shutil.copytree(corpus / "qa", root / "qa")
    last = sorted((root / "qa").glob("*.parquet"))[-1]
    good = pq.read_table(last)
    pq.write_table(good.rename_columns([f"renamed_{c}" for c in good.column_names]), last)  # the check reads the first
    path = qa_config(tmp_path, root)
    out = subprocess.run([*CLI, "up", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "Traceback (most recent call last):\n  File" not in out.stderr.split("error:")[0]
    assert f"file {last} has no column 'text'" in out.stderr, out.stderr  # the loader's one line, in its log's tail
    run_dir = load_config(path).run_dir
    assert not (run_dir / "plan-journal.jsonl").exists() and (run_dir / "logs").is_dir()  # its logs are kept
    pq.write_table(good, last)  # fixed
    with LocalCluster(path) as cluster:  # mode "new": no --fresh
        assert_every_planned_sample_once(cluster.planner, path, steps=2)
