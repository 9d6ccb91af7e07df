"""A transform in the user's own file, named by the config's ``plugins:``, reaches every process that
reads the config: ``overlord up`` and the ``overlord serve`` role processes it starts, ``overlord
partition``, ``status`` and ``overlord audit`` (fresh processes, as users run them). The Ray backend's
actors: tests/integration/test_ray.py."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import yaml

from flight_overlord import harness
from flight_overlord.config import load_config

from ..corpora import PLUGIN_TRANSFORM, row_of, shifted_bytes
from ..helpers import write_config

STEPS = 4
PLUGIN_OPTIONS = {"name": PLUGIN_TRANSFORM, "shift": 3}
CLI = [sys.executable, "-m", "flight_overlord.deploy.cli"]


def plugin_config(directory, corpus, plugin_file, **overrides):
    return write_config(directory, corpus, plugins=[str(plugin_file)], sources=[
        {"name": "qa", "paths": "qa/*.parquet", "weight": 0.5, "transform": PLUGIN_OPTIONS},
        {"name": "code", "paths": "code/*.parquet", "weight": 0.5}], **overrides)


def with_plugin_transform(path, plugin_file, source: str) -> None:
    """``path``'s config with the plugin named and ``source`` transformed by it."""
    raw = yaml.safe_load(path.read_text())
    raw["plugins"] = [str(plugin_file)]
    next(s for s in raw["sources"] if s["name"] == source)["transform"] = PLUGIN_OPTIONS
    path.write_text(yaml.safe_dump(raw))


def assert_plugin_tokens(tables, corpus, max_tokens: int = 1024) -> int:
    """Every qa sample holds the plugin's tokens of its text, every code sample the byte tokenizer's;
    returns how many samples were looked at."""
    looked = 0
    for table in tables:
        for keys, cu, ids in zip(*(table.column(c).to_pylist() for c in ("sample_keys", "cu_seqlens", "input_ids"))):
            for key, start, end in zip(keys, cu[:-1], cu[1:]):
                shift = PLUGIN_OPTIONS["shift"] if key.startswith("qa:") else 0
                assert ids[start:end] == shifted_bytes(row_of(corpus, key, ["text"])["text"], shift, max_tokens), key
                looked += 1
    return looked


def test_a_plugin_transform_under_up_serve_partition_and_audit(corpus, plugin_file, tmp_path):
    path = plugin_config(tmp_path, corpus, plugin_file)
    partition = subprocess.run([*CLI, "partition", str(path)], capture_output=True, text=True, timeout=120)
    assert partition.returncode == 0 and "qa" in partition.stdout, partition.stderr
    up = subprocess.Popen([*CLI, "up", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        address = up.stdout.readline().strip()
        assert address.startswith("grpc://127.0.0.1:"), up.stderr.read() if up.poll() is not None else address
        streams = harness.train(address, 2, 0, STEPS, on_table=lambda rank, client, table: table)
        status = subprocess.run([*CLI, "status", address, "--json"], capture_output=True, text=True, timeout=60)
        assert status.returncode == 0 and json.loads(status.stdout), status.stderr
    finally:
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=60)
    tables = [t for rank in streams.values() for t in rank]
    assert assert_plugin_tokens(tables, corpus) > 0
    sources = {k.split(":")[0] for t in tables for keys in t.column("sample_keys").to_pylist() for k in keys}
    assert sources == {"qa", "code"}
    audit = subprocess.run([*CLI, "audit", str(load_config(path).run_dir), "--json"], capture_output=True, text=True,
                           timeout=120)
    assert audit.returncode == 0, audit.stderr
    report = json.loads(audit.stdout)
    delivered = sum(len(keys) for t in tables for keys in t.column("sample_keys").to_pylist())
    assert (report["samples"], report["duplicates"], report["missing"]) == (delivered, 0, 0)
