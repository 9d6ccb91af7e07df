"""Trainer tokens bound to ranks, against a real cluster: a token for rank 0 reads, reports, asks its
rejoin position and redeems for rank 0 only; an unbound token still serves every rank; stock clients see the same."""
from __future__ import annotations

import json
import secrets
import threading

import pyarrow.flight as fl
import pytest

from flight_overlord.client import TrainerClient
from flight_overlord.config import ConfigError, load_config
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.wire.security import Credentials, Security

from ..helpers import delivered_keys, write_config

BATCH = fl.FlightDescriptor.for_path
STEPS = 3


def _with(token: str) -> fl.FlightCallOptions:
    return Credentials(token).call_options(30)


@pytest.fixture(scope="module")
def bound(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("bound")
    tokens = {"any": secrets.token_urlsafe(24), 0: secrets.token_urlsafe(24), 1: secrets.token_urlsafe(24)}
    (root / "trainers").write_text(f"{tokens['any']}\n{tokens[0]} 0   # rank 0's host\n{tokens[1]} 1\n")
    path = write_config(root, corpus, security={"trainer_tokens_file": str(root / "trainers")})
    with LocalCluster(path) as cluster:
        yield cluster, tokens


def test_a_token_bound_to_rank_0_cannot_ask_redeem_or_report_for_rank_1(bound):
    cluster, tokens = bound
    planner = fl.connect(cluster.planner)
    message = str(pytest.raises(fl.FlightUnauthorizedError, planner.get_flight_info,
                                BATCH("batch", "0", "1"), _with(tokens[0])).value)
    assert "this trainer token is bound to ranks 0, not rank 1" in message and tokens[0] not in message
    # Rank 1's own ticket, redeemed with rank 0's token at the constructor: refused there too.
    endpoint = planner.get_flight_info(BATCH("batch", "0", "1"), _with(tokens[1])).endpoints[0]
    constructor = fl.connect(endpoint.locations[0].uri.decode())
    with pytest.raises(fl.FlightUnauthorizedError, match="bound to ranks 0, not rank 1"):
        constructor.do_get(endpoint.ticket, _with(tokens[0])).read_all()
    report = lambda rank: fl.Action("report", json.dumps({"step": 0, "rank": rank, "losses": {"qa": 1.0}}).encode())  # noqa: E731
    with pytest.raises(fl.FlightUnauthorizedError, match="bound to ranks 0, not rank 1"):
        list(planner.do_action(report(1), _with(tokens[0])))
    position = lambda rank: fl.Action("position", json.dumps({"rank": rank}).encode())  # noqa: E731
    with pytest.raises(fl.FlightUnauthorizedError, match="bound to ranks 0, not rank 1"):
        list(planner.do_action(position(1), _with(tokens[0])))
    answer = json.loads(list(planner.do_action(position(0), _with(tokens[0])))[0].body.to_pybytes())
    assert answer["rank"] == 0 and answer["group"] == [0] and answer["step"] >= 0  # a rejoin's position: its own rank's
    with pytest.raises(fl.FlightUnauthenticatedError, match="needs a trainer token"):
        planner.get_flight_info(BATCH("batch", "0", "0"))


def test_bound_and_unbound_tokens_read_their_ranks_streams(bound):
    cluster, tokens = bound
    streams = {}

    def train(rank, token):
        with TrainerClient(cluster.planner, rank, num_steps=STEPS, as_tensors=False, token=token, timeout=60) as c:
            streams[(rank, token)] = list(c)
            c.report(STEPS - 1, {"qa": 1.0})

    threads = [threading.Thread(target=train, args=(0, tokens[0])),
               threading.Thread(target=train, args=(1, tokens["any"]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(streams) == sorted([(0, tokens[0]), (1, tokens["any"])])
    keys = [k for tables in streams.values() for k in delivered_keys(tables)]
    assert all(len(tables) == STEPS for tables in streams.values()) and len(keys) == len(set(keys)) > 0


def test_a_token_bound_outside_the_mesh_is_a_config_error(corpus, tmp_path):
    (tmp_path / "trainers").write_text(f"{secrets.token_urlsafe(24)} 0-1\n{secrets.token_urlsafe(24)} 2-3\n")
    path = write_config(tmp_path, corpus, security={"trainer_tokens_file": str(tmp_path / "trainers")})
    with pytest.raises(ConfigError, match=r"trainer_tokens_file: line 2 .* rank 3 is outside the mesh's 2 ranks"):
        Security.from_config(load_config(path), secrets.token_urlsafe(32))
    (tmp_path / "trainers").write_text(f"{secrets.token_urlsafe(24)} zero\n")
    with pytest.raises(ConfigError, match=r"line 1 .* 'zero' is not a rank or a span"):
        Security.from_config(load_config(path), secrets.token_urlsafe(32))
