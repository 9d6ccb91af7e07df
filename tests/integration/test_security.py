"""Secure and hard to break: each attack against live servers on loopback fails with an error that
says what is missing (and never holds a secret), stock Flight clients still work with the right
token and certificates, and the run delivers every planned sample exactly once afterwards.

Two start-ups: a run without a ``security`` section (the default contract: internal calls need
the run's cluster secret, trainer and inspection calls are open, tickets are signed), and a run
started with ``overlord up`` under mutual TLS with trainer and inspection tokens.
"""
from __future__ import annotations

import json
import secrets
import signal
import stat
import subprocess
import sys
import time

import psutil
import pyarrow.flight as fl
import pytest

from flight_overlord import wire
from flight_overlord.config import ConfigError, load_config, parse_config
from flight_overlord.deploy.certs import make_certs
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.deploy.status import cluster_status
from flight_overlord.deploy.topology import loader_hosts
from flight_overlord.planner.server import PlannerServer
from flight_overlord.source_catalog import received_catalog
from flight_overlord.wire.security import Credentials, Security
from flight_overlord.wire.server import connect

from ..helpers import assert_every_planned_sample_once, write_config

BATCH = fl.FlightDescriptor.for_path


def _refused(kind, call) -> str:
    with pytest.raises(kind) as info:
        call()
    return str(info.value)


def _register(client, body):
    return wire.call(client, "register", body)


# -- the default contract: no security section ---------------------------------------------------

@pytest.fixture(scope="module")
def plain(corpus, tmp_path_factory):
    path = write_config(tmp_path_factory.mktemp("plain"), corpus)
    with LocalCluster(path) as cluster:
        yield cluster, path


def test_register_needs_the_cluster_secret(plain):
    cluster, _ = plain
    hijack = {"role": "constructor", "index": 0, "location": "grpc://6.6.6.6:1"}
    stranger = fl.connect(cluster.planner)
    message = _refused(fl.FlightUnauthenticatedError, lambda: _register(stranger, hijack))
    assert "this call needs the run's cluster secret" in message and "no token was given" in message
    wrong = connect(cluster.planner, Credentials(secrets.token_urlsafe(32)))
    message = _refused(fl.FlightUnauthenticatedError, lambda: _register(wrong, hijack))
    assert "cluster secret" in message and "not valid for this run" in message
    loader = {"role": "loader", "source": "captions", "actor": 0, "location": "grpc://6.6.6.6:1", "row_groups": []}
    _refused(fl.FlightUnauthenticatedError, lambda: _register(stranger, loader))
    for action, body in (("plan", {"step": 0, "constructor": 0}), ("resume_point", {"constructor": 0})):
        assert "cluster secret" in _refused(fl.FlightUnauthenticatedError, lambda: wire.call(stranger, action, body))
    # The Planner still sends rank 0's trainers to the real constructor.
    info = stranger.get_flight_info(BATCH("batch", "0", "0"))
    assert info.endpoints[0].locations[0].uri.decode() == cluster.child("constructor-0").location
    assert cluster.secret not in message


def test_a_live_role_cannot_be_redirected_even_with_the_secret(plain):
    cluster, _ = plain
    insider = connect(cluster.planner, cluster.credentials)
    real = cluster.child("constructor-0").location
    message = _refused(fl.FlightServerError, lambda: _register(
        insider, {"role": "constructor", "index": 0, "location": "grpc://6.6.6.6:1"}))
    assert f"constructor 0 is registered at {real}, which still answers" in message
    message = _refused(fl.FlightServerError, lambda: _register(
        insider, {"role": "loader", "source": "code", "actor": 0, "location": "grpc://127.0.0.1:1", "row_groups": []}))
    assert "loader code[0] replica 0 is registered at" in message and "still answers" in message
    status = wire.call(insider, "status")
    assert status["constructors"]["0"] == real
    assert [loc for s, a, r, loc, _ in status["loaders"] if (s, a, r) == ("code", 0, 0)] == \
        [cluster.loader_of("code", 0).location]


def test_a_stranger_cannot_take_samples_from_a_loader(plain):
    cluster, _ = plain
    file = sorted(load_config(cluster.config_path).source("code").file_ids)[0]
    samples = wire.ticket({"kind": "samples", "step": 0, "constructor": 0, "samples": [[0, file, 0, 0]]})
    stranger = fl.connect(cluster.loader_of("code", 0).location)
    message = _refused(fl.FlightUnauthenticatedError, lambda: stranger.do_get(samples).read_all())
    assert "do_get of a 'samples' ticket: this call needs the run's cluster secret" in message
    metadata = wire.ticket({"kind": "metadata", "epoch": 0, "file": file, "row_group": 0})
    _refused(fl.FlightUnauthenticatedError, lambda: stranger.do_get(metadata).read_all())
    registry = json.loads((load_config(cluster.config_path).run_dir / "planner" / "registry.json").read_text())
    digest = next(share for source, *_, share in registry["loaders"] if source == "code")
    catalog = wire.ticket({"kind": "catalog", "source": "code", "digest": digest})  # what a Planner asks
    message = _refused(fl.FlightUnauthenticatedError, lambda: stranger.do_get(catalog).read_all())
    assert "do_get of a 'catalog' ticket: this call needs the run's cluster secret" in message
    insider = connect(cluster.loader_of("code", 0).location, cluster.credentials)
    assert received_catalog(insider.do_get(catalog).read_all(), digest).num_row_groups > 0  # its digest
    other = wire.ticket({"kind": "catalog", "source": "code", "digest": "0" * 32})
    message = _refused(fl.FlightServerError, lambda: insider.do_get(other).read_all())
    assert f"not found: catalog {'0' * 32} of source 'code' is not this loader's (it has {digest})" in message
    insider.close()
    # Inspection stays open without a security section: the buffer, status and listing.
    assert stranger.do_get(wire.ticket({"kind": "buffer"})).read_all().num_rows >= 0
    assert "buffered_samples" in wire.call(stranger, "status")


def _constructor(cluster, rank: int):
    return fl.connect(cluster.child(f"constructor-{rank}").location)  # dp 2: constructor i serves rank i


def test_forged_altered_and_expired_tickets_are_refused(plain):
    cluster, _ = plain
    planner = fl.connect(cluster.planner)
    ticket = json.loads(planner.get_flight_info(BATCH("batch", "1", "0")).endpoints[0].ticket.ticket)
    assert set(ticket) == {"kind", "step", "rank", "exp", "sig"}  # still JSON a stock client passes through
    c0, c1 = _constructor(cluster, 0), _constructor(cluster, 1)
    cases = [
        (c0, {"kind": "batch", "step": 1, "rank": 0}, "ticket is not signed"),
        (c0, {**ticket, "sig": "00" * 32}, "signature does not match"),
        (c0, {**ticket, "step": 2}, "signature does not match: the ticket was altered"),
        (c1, {**ticket, "rank": 1}, "signature does not match: the ticket was altered"),
        (c0, {**ticket, "exp": ticket["exp"] + 10 ** 6}, "signature does not match"),
        (c0, Security(secrets.token_urlsafe(32)).sign_ticket("batch", 1, 0), "not issued by this run's Planner"),
        (c0, Security(cluster.secret).sign_ticket("batch", 1, 0, expires=int(time.time()) - 60), "ticket expired"),
        (c0, {**ticket, "sig": 7}, "signature is malformed"),
    ]
    for client, forged, expected in cases:
        message = _refused(fl.FlightUnauthorizedError, lambda: client.do_get(wire.ticket(forged)).read_all())
        assert expected in message, (forged, message)
        assert cluster.secret not in message and ticket["sig"] not in message
    assert c0.do_get(fl.Ticket(json.dumps(ticket).encode())).read_all().num_rows == 2  # the real one works


def test_stock_client_needs_no_token_without_a_security_section(plain):
    cluster, _ = plain
    client = fl.connect(cluster.planner)
    listed = [f.descriptor.path for f in client.list_flights()]
    assert [b"source", b"qa"] in listed and any(p[0] == b"batch" for p in listed)
    endpoint = client.get_flight_info(BATCH("batch", "0", "1")).endpoints[0]
    table = fl.connect(endpoint.locations[0].uri.decode()).do_get(endpoint.ticket).read_all()
    assert table.num_rows == 2 and set(table.column("bucket").to_pylist()) == {1}
    assert wire.call(client, "report", {"step": 0, "rank": 0, "losses": {"qa": 1.0}}) == {"ok": True}


def test_the_secret_stays_off_command_lines_and_logs(plain):
    cluster, path = plain
    cfg = load_config(path)
    for pid in cluster.pids():
        assert cluster.secret not in " ".join(psutil.Process(pid).cmdline())
    stored = cfg.run_dir / "secrets" / "cluster-secret"
    assert stored.read_text().strip() == cluster.secret
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600 and stat.S_IMODE(stored.parent.stat().st_mode) == 0o700
    assert cluster.secret not in repr(cluster.credentials) and cluster.secret not in repr(cluster.security)
    for log in (cfg.run_dir / "logs").glob("*.log"):
        assert cluster.secret not in log.read_text(), log


def test_the_run_is_unharmed_after_the_attacks(plain):
    cluster, path = plain
    assert_every_planned_sample_once(cluster.planner, path)
    assert all(c.process.poll() is None and not c.restarts for c in cluster.children)


def test_a_role_moves_only_when_its_registered_address_is_down(corpus, tmp_path):
    """The recovery path, on an in-process Planner: same address always; another one only once the
    registered address stops answering."""
    cfg = load_config(write_config(tmp_path, corpus))
    security = Security(secrets.token_urlsafe(32))
    planner = PlannerServer(cfg, port=0, security=security)
    old = fl.FlightServerBase("grpc://127.0.0.1:0")
    old_up = True
    try:
        client = connect(f"grpc://127.0.0.1:{planner.port}", security.credentials)
        first = {"role": "constructor", "index": 1, "location": f"grpc://127.0.0.1:{old.port}"}
        assert _register(client, first) == {"ok": True}
        assert _register(client, first) == {"ok": True}  # a restart on the same address
        moved = {**first, "location": "grpc://127.0.0.1:1"}
        assert "still answers" in _refused(fl.FlightServerError, lambda: _register(client, moved))
        old.shutdown()
        old_up = False
        assert _register(client, moved) == {"ok": True}
        assert wire.call(client, "status")["constructors"]["1"] == "grpc://127.0.0.1:1"
        assert "must be grpc://HOST:PORT" in _refused(fl.FlightServerError, lambda: _register(
            client, {**first, "location": "grpc+tls://127.0.0.1:5"}))
    finally:
        if old_up:
            old.shutdown()
        planner.shutdown()


def test_security_config_errors_name_the_key(corpus, tmp_path):
    base = {"sources": [{"name": "qa", "paths": "qa/*.parquet"}],
                          "global_batch": {"context_length": 256, "tokens_per_step": 512}, "data_root": str(corpus)}
    (tmp_path / "short").write_text("tooshort\n")
    cases = [
        ({"trainer_tokens_file": "missing"}, "security.trainer_tokens_file: file not found"),
        ({"tls": {"cert": "short"}}, "security.tls: give both cert and key"),
        ({"tls": {"cert": "short", "key": "short", "verify_client": True}}, "security.tls.ca: mutual TLS"),
        ({"tls": {"verify_client": "yes"}}, "security.tls.verify_client: expected true or false"),
        ({"ticket_ttl_seconds": 0}, "security.ticket_ttl_seconds: must be >= 1"),
        ({"tokens": "x"}, "unknown key 'security.tokens'"),
    ]
    for security, expected in cases:
        with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
            parse_config({**base, "security": security}, base_dir=tmp_path)
    cfg = parse_config({**base, "security": {"trainer_tokens_file": "short"}}, base_dir=tmp_path)
    with pytest.raises(ConfigError, match="security.trainer_tokens_file: line 1 .* at least 16 characters") as info:
        Security.from_config(cfg, secrets.token_urlsafe(32))
    assert "tooshort" not in str(info.value)


# -- mutual TLS, trainer and inspection tokens, started with `overlord up` --------------------------

@pytest.fixture(scope="module")
def guarded(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("guarded")
    certs = make_certs(root / "certs")
    tokens = {"trainer": secrets.token_urlsafe(24), "inspect": secrets.token_urlsafe(24)}
    (root / "trainers").write_text(f"# one per line\n{secrets.token_urlsafe(24)}\n{tokens['trainer']}\n")
    (root / "inspect").write_text(tokens["inspect"] + "\n")
    path = write_config(root, corpus, security={
        "trainer_tokens_file": str(root / "trainers"), "inspect_token_file": str(root / "inspect"),
        "tls": {"cert": str(certs["server.pem"]), "key": str(certs["server.key"]), "ca": str(certs["ca.pem"]),
                "verify_client": True}})
    proc = subprocess.Popen([sys.executable, "-m", "flight_overlord.deploy.cli", "up", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        address = proc.stdout.readline().strip()  # printed once every role is ready
        pem = {name: p.read_bytes() for name, p in certs.items()}
        yield {"address": address, "path": path, "proc": proc, "tokens": tokens, "pem": pem, "certs": certs,
               "run": Security.from_config(load_config(path))}  # the run's own tools: secret from run_dir
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _stock(g, location=None, *, ca=True, client_cert=True) -> fl.FlightClient:
    """A stock pyarrow client, no middleware: TLS material only."""
    pem = g["pem"]
    options = {"tls_root_certs": pem["ca.pem"]} if ca else {}
    if client_cert:
        options.update(cert_chain=pem["client.pem"], private_key=pem["client.key"])
    return fl.FlightClient(location or g["address"], **options)


def _with(token: str | None, timeout: float = 10) -> fl.FlightCallOptions:
    return Credentials(token).call_options(timeout)


def test_up_prints_a_tls_address_and_keeps_the_secret_off_command_lines(guarded):
    g = guarded
    assert g["address"].startswith("grpc+tls://127.0.0.1:"), g["address"]
    secret = g["run"].credentials.token
    children = psutil.Process(g["proc"].pid).children(recursive=True)
    assert len(children) == 1 + len(loader_hosts(load_config(g["path"]))) + 2  # planner, loaders, constructors
    for child in children:
        assert secret not in " ".join(child.cmdline())
    stored = load_config(g["path"]).run_dir / "secrets" / "cluster-secret"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600


def test_stock_client_with_token_and_ca_follows_the_planner_endpoint(guarded):
    g = guarded
    token = g["tokens"]["trainer"]
    planner = _stock(g)
    info = planner.get_flight_info(BATCH("batch", "0", "1"), _with(token))
    endpoint = info.endpoints[0]
    location = endpoint.locations[0].uri.decode()
    assert location.startswith("grpc+tls://127.0.0.1:")
    table = _stock(g, location).do_get(endpoint.ticket, _with(token)).read_all()
    assert table.num_rows == 2 and set(table.column("bucket").to_pylist()) == {1}

    # Without the token: refused at the Planner and at the constructor, saying what is missing.
    message = _refused(fl.FlightUnauthenticatedError,
                       lambda: planner.get_flight_info(BATCH("batch", "0", "1"), _with(None)))
    assert "this call needs a trainer token" in message
    assert "trainer token" in _refused(fl.FlightUnauthenticatedError,
                                       lambda: _stock(g, location).do_get(endpoint.ticket, _with(None)).read_all())
    # Without the CA, or without a client certificate under mutual TLS: no connection at all.
    _refused(fl.FlightUnavailableError, lambda: _stock(g, ca=False).get_flight_info(
        BATCH("batch", "0", "1"), _with(token, 5)))
    _refused(fl.FlightUnavailableError, lambda: _stock(g, client_cert=False).get_flight_info(
        BATCH("batch", "0", "1"), _with(token, 5)))
    plaintext = g["address"].replace("grpc+tls://", "grpc://")
    _refused(fl.FlightUnavailableError, lambda: fl.connect(plaintext).get_flight_info(
        BATCH("batch", "0", "1"), _with(token, 5)))


def test_report_and_inspection_need_their_tokens(guarded):
    g = guarded
    planner = _stock(g)
    report = fl.Action("report", json.dumps({"step": 0, "rank": 0, "losses": {"qa": 9.0}}).encode())
    message = _refused(fl.FlightUnauthenticatedError, lambda: list(planner.do_action(report, _with(None))))
    assert "action 'report': this call needs a trainer token" in message
    message = _refused(fl.FlightUnauthorizedError,
                       lambda: list(planner.do_action(report, _with(g["tokens"]["inspect"]))))
    assert "needs the trainer role" in message and "an inspection token does not allow it" in message
    assert len(list(planner.do_action(report, _with(g["tokens"]["trainer"])))) == 1

    message = _refused(fl.FlightUnauthenticatedError, lambda: list(planner.list_flights(options=_with(None))))
    assert "list_flights: this call needs an inspection token" in message
    for token in (g["tokens"]["inspect"], g["tokens"]["trainer"]):
        assert [b"source", b"qa"] in [f.descriptor.path for f in planner.list_flights(options=_with(token))]
    message = _refused(fl.FlightUnauthorizedError, lambda: planner.get_flight_info(
        BATCH("batch", "0", "0"), _with(g["tokens"]["inspect"])))
    assert "needs the trainer role" in message
    # Trainer tokens are not the cluster secret: no internal calls.
    message = _refused(fl.FlightUnauthorizedError, lambda: list(planner.do_action(
        fl.Action("register", json.dumps({"role": "constructor", "index": 0,
                                          "location": "grpc+tls://127.0.0.1:1"}).encode()),
        _with(g["tokens"]["trainer"]))))
    assert "needs the cluster role" in message and "a trainer token does not allow it" in message
    status = wire.call(connect(g["address"], g["run"].credentials), "status")
    loader = _stock(g, status["loaders"][0][3])
    message = _refused(fl.FlightUnauthorizedError, lambda: loader.do_get(
        wire.ticket({"kind": "samples", "step": 0, "constructor": 0, "samples": []}),
        _with(g["tokens"]["trainer"])).read_all())
    assert "needs the cluster role" in message
    secrets_ = [g["run"].credentials.token, *g["tokens"].values()]
    for text in (message, json.dumps(status)):
        assert not any(s in text for s in secrets_)


def test_the_run_s_own_tools_use_its_credentials(guarded):
    g = guarded
    status = cluster_status(g["address"], credentials=g["run"].credentials)
    assert status["up"], status["totals"]["down"]
    out = subprocess.run([sys.executable, "-m", "flight_overlord.deploy.cli", "inspect", g["address"],
                          "--config", str(g["path"])], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "head of the stream (2 rows" in out.stdout and "source/captions" in out.stdout
    certs = g["certs"]
    out = subprocess.run([sys.executable, "-m", "flight_overlord.deploy.cli", "inspect", g["address"],
                          "--ca", str(certs["ca.pem"]), "--cert", str(certs["client.pem"]),
                          "--key", str(certs["client.key"])], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "needs an inspection token" in out.stderr
    assert not any(t in out.stderr + out.stdout for t in g["tokens"].values())


def test_trainers_with_tokens_get_every_planned_sample_once(guarded):
    g = guarded
    creds = Credentials.from_files(token=g["tokens"]["trainer"], ca=g["certs"]["ca.pem"],
                                   cert=g["certs"]["client.pem"], key=g["certs"]["client.key"])
    assert_every_planned_sample_once(g["address"], g["path"], steps=5, credentials=creds)
    logs = load_config(g["path"]).run_dir / "logs"
    secrets_ = [g["run"].credentials.token, *g["tokens"].values()]
    for log in logs.glob("*.log"):
        text = log.read_text()
        assert not any(s in text for s in secrets_), log
