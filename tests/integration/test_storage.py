"""Sources on remote storage: a real local S3 server (moto's server mode on 127.0.0.1), read through
``pyarrow.fs`` URIs whose query string is honoured; errors name the URI without its query string, never
credentials. ``overlord make-demo-data`` writes there; a wrong key, a denied read (moto enforcing IAM) and a
file deleted mid-run are named; a kill -9 of a loader reading from S3 changes no stream."""
from __future__ import annotations

import contextlib
import json
import os
import urllib.request

import pyarrow.flight as fl
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from benchmarks.common.s3 import moto_s3
from flight_overlord import wire
from flight_overlord.client import StepFetcher
from flight_overlord.config import ConfigError, load_config
from flight_overlord.demo.data import make_many_sources
from flight_overlord.deploy import cli
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.planner.replay import PlanMismatch
from flight_overlord.wire.server import connect

from ..helpers import delivered_keys, fetch_run, journal, write_config

BUCKET = "overlord-data"
SOURCES = {"qa": 0.5, "captions": 0.5}


@contextlib.contextmanager
def _env(**values):
    """Set environment variables (the roles are child processes: they inherit them), restore after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def s3(corpus):
    """A moto S3 server holding two demo sources; yields the URI query string that reaches it."""
    with _env(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_EC2_METADATA_DISABLED="true"):
        with moto_s3(corpus, SOURCES, BUCKET) as (query, _, fs):
            yield query, fs


def _s3_config(directory, corpus, query, paths=None):
    sources = [{"name": n, "paths": (paths or {}).get(n, f"s3://{BUCKET}/{n}/*.parquet?{query}"), "weight": w}
               for n, w in SOURCES.items()]
    return write_config(directory, corpus, sources=sources)


STEPS = 8


@pytest.fixture(scope="module")
def s3_run(s3, corpus, tmp_path_factory):
    """An undisturbed run over the S3 sources: (config, {rank: tables})."""
    path = _s3_config(tmp_path_factory.mktemp("s3run"), corpus, s3[0])
    return path, fetch_run(path, steps=STEPS)


def test_a_cluster_reads_s3_sources_exactly_once_and_byte_for_byte(s3, s3_run, corpus):
    query, _ = s3
    path, run = s3_run
    cfg = load_config(path)
    assert all(f.startswith(f"s3://{BUCKET}/") and query in f for s in cfg.sources for f in s.files)
    assert all("?" not in i for s in cfg.sources for i in s.file_ids)  # keys never carry the query string
    planned = [k for record in journal(path)[:STEPS] for b in record["bins"] for k in b]
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


def _keys(tables) -> list[list[list[str]]]:
    return [t.column("sample_keys").to_pylist() for t in tables]


def test_kill_9_of_a_loader_reading_from_s3_changes_no_stream(s3, s3_run, corpus, tmp_path):
    reference_path, reference = s3_run
    path = _s3_config(tmp_path, corpus, s3[0])
    ranks = load_config(path).mesh.world_size
    with LocalCluster(path) as cluster:
        fetchers = [StepFetcher(cluster.planner, r, timeout=60) for r in range(ranks)]
        run = {r: [] for r in range(ranks)}
        victim = cluster.loader_of("captions", 0).name  # whatever loader.hosts grouped it with
        for step in range(STEPS):
            if step == 3:
                cluster.kill(victim)
            for r, f in enumerate(fetchers):
                run[r].append(f.fetch(step))
        for f in fetchers:
            f.close()
        assert cluster.child(victim).restarts  # it really died and came back
    assert {r: _keys(t) for r, t in run.items()} == {r: _keys(t) for r, t in reference.items()}


def test_make_demo_data_writes_to_s3(s3, tmp_path, capsys):
    query, fs = s3
    cli.main(["make-demo-data", f"s3://{BUCKET}/made?{query}", "--sources", "2", "--rows-per-source", "40"])
    out = capsys.readouterr().out
    assert f"to s3://{BUCKET}/made\n" in out and "endpoint_override" not in out
    local = make_many_sources(tmp_path / "local", 2, rows_per_source=40)  # the same files, written locally
    for source, paths in local.items():
        for path in paths:
            with fs.open_input_stream(f"{BUCKET}/made/{source}/{path.name}") as remote:
                assert remote.read() == path.read_bytes(), f"{source}/{path.name}"
    cfg = load_config(write_config(tmp_path / "cfg", tmp_path, sources=[
        {"name": s, "paths": f"s3://{BUCKET}/made/{s}/*.parquet?{query}", "weight": 1.0} for s in local]))
    assert [len(s.files) for s in cfg.sources] == [len(p) for p in local.values()]
    with pytest.raises(SystemExit, match="error: cannot write to s3://no-such-bucket/made: 'no-such-bucket' does "
                                         "not exist") as info:
        cli.main(["make-demo-data", f"s3://no-such-bucket/made?{query}", "--sources", "1"])
    assert "endpoint_override" not in str(info.value)


WRONG_SECRET = "wrong-secret-0000000000000000000000000000"


@pytest.fixture(scope="module")
def s3_iam(corpus):
    """A moto server enforcing IAM (after its set-up): a user who may read everything, one who may only
    list, an admin. Yields (query, {"reader": credentials, "lister": ..., "admin": ...}, IAM endpoint)."""
    import boto3
    with moto_s3(corpus, SOURCES, "guarded") as (query, port, _):
        iam = boto3.client("iam", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
        users = {}
        for user, actions in (("reader", ["s3:*"]), ("lister", ["s3:ListBucket"]), ("admin", ["*"])):
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps({
                "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            users[user] = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset-auth", data=b"0", method="POST",
                                         headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=10).read()  # from now on every request is authenticated
        yield query, users, f"http://127.0.0.1:{port}"


def test_a_wrong_key_names_the_uri_never_the_credentials(s3_iam, corpus, tmp_path):
    query, users, _ = s3_iam
    path = _s3_config(tmp_path, corpus, query, {n: f"s3://guarded/{n}/*.parquet?{query}" for n in SOURCES})
    with _env(**users["reader"]):
        assert len(load_config(path).sources[0].files) > 1  # the right key lists the files
    with _env(AWS_ACCESS_KEY_ID="AKIAWRONGKEY00000000", AWS_SECRET_ACCESS_KEY=WRONG_SECRET):
        with pytest.raises(ConfigError, match=r"cannot list s3://guarded/\w+/\*\.parquet") as info:
            load_config(path)
    message = str(info.value)
    assert "AKIAWRONGKEY" not in message and WRONG_SECRET not in message and "endpoint_override" not in message


def test_a_denied_read_names_the_file(s3_iam, corpus, tmp_path):
    query, users, _ = s3_iam
    path = _s3_config(tmp_path, corpus, query, {n: f"s3://guarded/{n}/*.parquet?{query}" for n in SOURCES})
    with _env(**users["lister"]):  # may list the bucket, not read its objects
        cluster = LocalCluster(path)  # the config loads: listing is allowed
        with pytest.raises(ConfigError, match=r"cannot read Parquet file s3://guarded/\w+/part-\d+\.parquet") as info:
            cluster.start()  # named before any role starts (the check of the sources' files)
    message = str(info.value)
    assert "ACCESS_DENIED" in message, message
    assert users["lister"]["AWS_SECRET_ACCESS_KEY"] not in message and "endpoint_override" not in message


def test_a_file_deleted_mid_run_is_named_and_the_loader_lives_on(s3, corpus, tmp_path):
    query, fs = s3
    prefix = f"{BUCKET}/deleting"
    for name in SOURCES:  # a copy of its own: the other tests keep their files
        for path in sorted((corpus / name).glob("*.parquet")):
            pafs.copy_files(str(path), f"{prefix}/{name}/{path.name}", destination_filesystem=fs)
    path = _s3_config(tmp_path, corpus, query, {n: f"s3://{prefix}/{n}/*.parquet?{query}" for n in SOURCES})
    path.write_text(path.read_text() + "loader: {read_ahead_row_groups: 1}\n")
    victim = sorted((corpus / "captions").glob("*.parquet"))[-1].name
    ranks = load_config(path).mesh.world_size
    with LocalCluster(path) as cluster:
        loader = cluster.loader_of("captions", 0)
        pid = loader.process.pid
        fetchers = [StepFetcher(cluster.planner, r, timeout=60) for r in range(ranks)]
        delivered = []
        for step in range(12):
            if step == 1:
                fs.delete_file(f"{prefix}/captions/{victim}")
            delivered += [k for f in fetchers for k in delivered_keys([f.fetch(step)])]
        for f in fetchers:
            f.close()
        assert loader.process.poll() is None and loader.process.pid == pid and not loader.restarts  # lived on
        client = connect(loader.location, cluster.credentials)
        status = wire.call(client, "status")  # what `overlord status` and the metrics page count
        client.close()
        assert status["failed_reads"] >= 1
        assert all(f.startswith(f"s3://{prefix}/captions/{victim} row group") for f in status["recent_failed_reads"])
    log = loader.log_path.read_text()
    assert f"cannot read s3://{prefix}/captions/{victim} row group" in log, log[-3000:]
    assert "endpoint_override" not in log and "testing" not in log
    assert len(set(delivered)) == len(delivered)  # what arrived, arrived once
    # A step planned from the deleted file's rows cannot be planned again from the files (their
    # metadata went with the file): the journal names the step, never serving another plan.
    with pytest.raises(PlanMismatch, match=r"^step \d+: planned again from the journal"):
        journal(path)


def test_a_read_denied_mid_run_is_named_and_the_loader_lives_on(s3_iam, corpus, tmp_path):
    """The reader's permission is revoked mid-run: the loaders record each denied row group by URI and
    stay up; once a source has no readable row group left the Planner stops planning with an error
    that names the source, which trainers get; what arrived before arrived once."""
    import boto3
    query, users, endpoint = s3_iam
    path = _s3_config(tmp_path, corpus, query, {n: f"s3://guarded/{n}/*.parquet?{query}" for n in SOURCES})
    path.write_text(path.read_text() + "loader: {read_ahead_row_groups: 1}\n")
    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id=users["admin"]["AWS_ACCESS_KEY_ID"],
                       aws_secret_access_key=users["admin"]["AWS_SECRET_ACCESS_KEY"])
    with _env(**users["reader"]):
        cfg = load_config(path)
        cluster = LocalCluster(path)
    ranks = cfg.mesh.world_size
    try:
        with _env(**users["reader"]):  # the roles inherit the reader's key
            cluster.start()
        loaders = [c for c in cluster.children if c.args[0] == "loader"]  # every loader process
        pids = [lo.process.pid for lo in loaders]
        fetchers = [StepFetcher(cluster.planner, r, timeout=60) for r in range(ranks)]
        delivered, error = [], None
        for step in range(40):
            if step == 1:
                iam.delete_user_policy(UserName="reader", PolicyName="s3")  # from now on: AccessDenied
            try:
                delivered += [k for f in fetchers for k in delivered_keys([f.fetch(step)])]
            except fl.FlightServerError as exc:
                error = str(exc)
                break
        for f in fetchers:
            f.close()
        assert error and "no readable sample in a whole epoch" in error and "see its loaders' logs" in error, error
        alive = [*loaders, cluster.child("planner")]
        assert [lo.process.pid for lo in loaders] == pids and all(c.process.poll() is None for c in alive)
        failed = []
        for lo in loaders:
            client = connect(lo.location, cluster.credentials)
            failed += [f for actor in wire.call(client, "status")["actors"] for f in actor["recent_failed_reads"]]
            client.close()
    finally:
        cluster.stop()
    assert failed and all(f.startswith("s3://guarded/") and "ACCESS_DENIED" in f for f in failed), failed
    assert all("endpoint_override" not in f and users["reader"]["AWS_SECRET_ACCESS_KEY"] not in f for f in failed)
    with _env(**users["admin"]):  # re-derived: the row groups denied to the loaders as they saw them (journaled)
        planned = {k for record in journal(path) for b in record["bins"] for k in b}
    assert set(delivered) <= planned and len(set(delivered)) == len(delivered)
