"""Sources on remote storage: a real local S3 server (moto's server mode on 127.0.0.1), read through
``pyarrow.fs`` URIs whose query string is honoured; errors name the URI without its query string."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from flight_overlord.config import ConfigError, load_config

from ..helpers import delivered_keys, fetch_run, journal, write_config

BUCKET = "overlord-data"
SOURCES = {"qa": 0.5, "captions": 0.5}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(corpus):
    """A moto S3 server holding two demo sources; yields the URI query string that reaches it."""
    port = _free_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the roles are child processes: they inherit the credentials
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", region="us-east-1",
                               access_key="testing", secret_key="testing", allow_bucket_creation=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                fs.create_dir(BUCKET)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for name in SOURCES:
            for path in sorted((corpus / name).glob("*.parquet")):
                pafs.copy_files(str(path), f"{BUCKET}/{name}/{path.name}", destination_filesystem=fs)
        yield f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1", fs
    finally:
        server.terminate()
        server.wait(10)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _s3_config(directory, corpus, query, paths=None):
    sources = [{"name": n, "paths": (paths or {}).get(n, f"s3://{BUCKET}/{n}/*.parquet?{query}"), "weight": w}
               for n, w in SOURCES.items()]
    return write_config(directory, corpus, sources=sources)


def test_a_cluster_reads_s3_sources_exactly_once_and_byte_for_byte(s3, corpus, tmp_path):
    query, _ = s3
    path = _s3_config(tmp_path, corpus, query)
    cfg = load_config(path)
    assert all(f.startswith(f"s3://{BUCKET}/") and query in f for s in cfg.sources for f in s.files)
    assert all("?" not in i for s in cfg.sources for i in s.file_ids)  # keys never carry the query string
    run = fetch_run(path, steps=6)
    planned = [k for record in journal(path)[:6] for b in record["bins"] for k in b]
    delivered = [k for r in run for k in delivered_keys(run[r])]
    assert sorted(delivered) == sorted(planned) and len(set(delivered)) == len(delivered) > 20
    for table in run[0][:2]:  # every token is the Parquet text's bytes (byte tokenizer)
        ids = table.column("input_ids").combine_chunks()
        for m, keys in enumerate(table.column("sample_keys").to_pylist()):
            row_ids = ids[m].values.to_numpy()
            lengths = table.column("cu_seqlens")[m].as_py()
            for key, start, end in zip(keys, lengths, lengths[1:]):
                source, rest = key.split(":", 1)
                file, rg, row = rest.rsplit(":", 2)
                local = corpus / source / file.rsplit("/", 1)[1]
                text = pq.ParquetFile(local).read_row_group(int(rg), columns=["text"]).column(0)[int(row)].as_py()
                assert row_ids[start:end].tolist() == list(text.encode()[:1024]), key


def test_a_missing_bucket_or_file_is_named_without_the_query_string(s3, corpus, tmp_path):
    query, _ = s3
    missing = _s3_config(tmp_path / "a", corpus, query, {"qa": f"s3://no-such-bucket/qa/*.parquet?{query}"})
    with pytest.raises(ConfigError, match=r"s3://no-such-bucket/qa/\*\.parquet") as info:
        load_config(missing)
    assert "endpoint_override" not in str(info.value)
    nothing = _s3_config(tmp_path / "b", corpus, query, {"qa": f"s3://{BUCKET}/nope/*.parquet?{query}"})
    with pytest.raises(ConfigError, match=f"no file matches the glob: s3://{BUCKET}/nope"):
        load_config(nothing)
    absent = _s3_config(tmp_path / "c", corpus, query, {"qa": f"s3://{BUCKET}/qa/absent.parquet?{query}"})
    with pytest.raises(ConfigError, match=f"file not found: s3://{BUCKET}/qa/absent.parquet"):
        load_config(absent)
