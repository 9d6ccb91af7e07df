"""Prometheus metrics on a real deployment: every role's /metrics page, scraped over HTTP on 127.0.0.1,
moves with the run (samples served equal what the trainers received, planned samples equal the
journal's), and a kill -9 of a loader shows up as a re-registration."""
from __future__ import annotations

import contextlib
import random
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flight_overlord import allocator, wire
from flight_overlord.client import StepFetcher
from flight_overlord.config import ConfigError, load_config
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.deploy.node import previous_ports
from flight_overlord.metrics import METRICS
from flight_overlord.wire.plan_channel import PLAN_AHEAD
from flight_overlord.wire.server import connect

from ..helpers import delivered_keys, journal, write_config

STEPS = 4
RANKS = 2


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value of one /metrics page."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def pick(page: dict, name: str, **labels) -> float:
    want = tuple(sorted((k, str(v)) for k, v in labels.items()))
    return page[(name, want)]


def total(page: dict, name: str) -> float:
    return sum(v for (n, _), v in page.items() if n == name)


def status(location: str, credentials) -> dict:
    client = connect(location, credentials)
    try:
        return wire.call(client, "status")
    finally:
        client.close()


@pytest.fixture(scope="module")
def cluster(corpus, tmp_path_factory):
    path = write_config(tmp_path_factory.mktemp("metrics"), corpus, mesh={"dp": RANKS}, metrics={"port": 0},
                        loader={"hosts": 2})
    with LocalCluster(path) as cluster:
        yield cluster, path


def role_pages(cluster) -> dict[str, str]:
    """Every role's metrics URL, from its status (port 0: each picked a free port)."""
    planner = status(cluster.planner, cluster.credentials)
    urls = {"planner": planner["metrics"]}
    for location in sorted({loc for *_, loc, _ in planner["loaders"]}):
        urls[f"loader {location}"] = status(location, cluster.credentials)["metrics"]
    for index, location in planner["constructors"].items():
        urls[f"constructor {index}"] = status(location, cluster.credentials)["metrics"]
    assert all(u and u.startswith("http://127.0.0.1:") for u in urls.values()), urls
    return urls


def test_every_role_exposes_metrics_that_move_with_the_run(cluster):
    cluster, path = cluster
    urls = role_pages(cluster)
    assert len(urls) == 1 + 2 + RANKS  # planner, two loader hosts, one constructor per rank
    before = {role: scrape(url) for role, url in urls.items()}
    addresses = {"planner": cluster.planner, **{f"constructor {i}": loc for i, loc in
                                                 status(cluster.planner, cluster.credentials)["constructors"].items()}}
    for role, page in before.items():
        address = addresses.get(role, role.split()[-1])  # "loader ADDRESS"
        assert pick(page, "overlord_role_up", role=role.split()[0], address=address) == 1
        assert {n for n, _ in page if n.startswith("overlord_")} <= {n + s for n in METRICS for s in ("", "_total")}
        assert "process_resident_memory_bytes" in {n for n, _ in page}
    assert all(v == 0 for (n, _), v in before["constructor 0"].items()
               if n == "overlord_constructor_samples_served_total")

    fetchers = [StepFetcher(cluster.planner, r, timeout=60) for r in range(RANKS)]
    try:
        received = {r: [f.fetch(step) for step in range(STEPS)] for r, f in enumerate(fetchers)}
    finally:
        for f in fetchers:
            f.close()
    after = {role: scrape(url) for role, url in urls.items()}

    for r in range(RANKS):  # rank r is served by constructor r (dp_per_constructor 1)
        page = after[f"constructor {r}"]
        assert pick(page, "overlord_constructor_samples_served_total", rank=r) == len(delivered_keys(received[r])) > 0
        assert pick(page, "overlord_constructor_batches_served_total", rank=r) == STEPS
        assert pick(page, "overlord_constructor_step_served", rank=r) == STEPS - 1
        assert pick(page, "overlord_constructor_bytes_served_total", rank=r) > 0
        assert pick(page, "overlord_constructor_steps_assembled_total", constructor=r) >= STEPS
        assert pick(page, "overlord_constructor_bytes_fetched_total", constructor=r) > 0
        assert pick(page, "overlord_role_errors", role="constructor") == 0

    # The Planner plans prefetch (2) + PLAN_AHEAD steps past the trainers, then stops: wait for that, then read it
    # settled
    deadline = time.monotonic() + 30
    while pick(scrape(urls["planner"]), "overlord_planner_steps_planned_total") < STEPS + 2 + PLAN_AHEAD:
        assert time.monotonic() < deadline, "the Planner did not plan prefetch steps ahead"
        time.sleep(0.1)
    time.sleep(0.5)
    planner = scrape(urls["planner"])
    assert pick(planner, "overlord_planner_steps_planned_total") == STEPS + 2 + PLAN_AHEAD
    plans = journal(path)
    planned_steps = int(pick(planner, "overlord_planner_steps_planned_total"))
    by_source: dict[str, int] = {}
    for record in plans[:planned_steps]:
        for key in (k for b in record["bins"] for k in b):
            by_source[key.split(":", 1)[0]] = by_source.get(key.split(":", 1)[0], 0) + 1
    for source, n in by_source.items():
        assert pick(planner, "overlord_planner_samples_planned_total", source=source) == n
    assert total(planner, "overlord_planner_mixture_realized") == pytest.approx(1.0)
    assert {pick(planner, "overlord_planner_step_requested", rank=r) for r in range(RANKS)} == {STEPS - 1}
    assert pick(planner, "overlord_planner_registered_roles", role="loader") == len(load_config(path).sources)
    # every step a constructor assembled came in a plans-stream answer: asked for, or along with the one before
    answers = {dict(labels)["views"]: n for (name, labels), n in planner.items()  # by constructor plans carried
               if name == "overlord_planner_plan_answers_total"}
    assert set(answers) <= {"1", "2"} and sum(int(k) * n for k, n in answers.items()) >= STEPS * RANKS
    assert answers.get("2", 0) > 0  # the Planner plans ahead: the next step's constructor plan came along

    def loader_bytes(pages):
        return sum(total(pages[role], "overlord_loader_bytes_served_total")
                   for role in urls if role.startswith("loader"))
    assert loader_bytes(after) > loader_bytes(before)  # (the constructors prefetch: no exact figure while it runs)
    sources = {dict(labels)["source"] for role in urls if role.startswith("loader")
               for (n, labels) in after[role] if n == "overlord_loader_buffered_samples"}
    assert sources == {s.name for s in load_config(path).sources}


def test_a_killed_loader_counts_as_a_reregistration_and_serves_metrics_again(cluster):
    cluster, _ = cluster
    planner_url = role_pages(cluster)["planner"]
    before = pick(scrape(planner_url), "overlord_planner_reregistrations_total", role="loader")
    cluster.kill("loader-host1")
    cluster.wait_restarted("loader-host1")
    after = scrape(planner_url)
    # the host serves three actors: each registers again
    assert pick(after, "overlord_planner_reregistrations_total", role="loader") == before + 3
    page = scrape(role_pages(cluster)[f"loader {cluster.child('loader-host1').location}"])
    assert total(page, "overlord_loader_buffered_row_groups") >= 0 and total(page, "overlord_role_up") == 1


@pytest.mark.skipif(not allocator._glibc(), reason="glibc's malloc tunables only")
def test_loader_hosts_run_without_glibcs_thread_caches_and_the_planner_with_them(cluster):
    """The loader hosts' command ran itself again with the caches off (flight_overlord/allocator.py),
    as the supervisor started it; the Planner's was left alone."""
    cluster, _ = cluster

    def tunables(name: str) -> str | None:
        environ = Path(f"/proc/{cluster.child(name).process.pid}/environ").read_bytes().split(b"\0")
        return next((e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"GLIBC_TUNABLES=")), None)
    hosts = [c.name for c in cluster.children if c.name.startswith("loader-host")]
    assert hosts and all(tunables(name) == "glibc.malloc.tcache_count=0" for name in hosts)
    assert tunables("planner") is None


def test_bad_metrics_and_advertise_keys_are_named(corpus, tmp_path):
    for raw, message in [({"metrics": {"port": -1}}, "metrics.port: must be >= 0"),
                         ({"metrics": {"port": 70000}}, "metrics.port: must be <= 65535"),
                         ({"metrics": {"prot": 0}}, "unknown key 'metrics.prot'"),
                         ({"network": {"advertise": "grpc://10.0.0.5:9000"}}, "network.advertise: 'grpc://10.0.0.5"),
                         ({"network": {"advertise": "node-3:9000"}}, "network.advertise: 'node-3:9000' is not a host")]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            load_config(write_config(tmp_path, corpus, **raw))


def test_a_recovered_planner_and_scaling_show_in_its_page():
    """Pure: a restarted Planner's status (recovered, scaling on) as the page renders it."""
    from prometheus_client import CollectorRegistry, generate_latest

    from flight_overlord.metrics import _Collector
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector("planner", "grpc://h:1", lambda: {
        "planned": 9, "recovered": True, "error": None, "requested": {"0": 8}, "samples_planned": {"web": 30},
        "mixture_realized": {"web": 1.0}, "reregistrations": {"loader": 2, "constructor": 0},
        "scaling": {"actors": {"web": 3}}, "loaders": [["web", 0, 0, "grpc://h:2", []]], "constructors": {"0": "x"}}))
    text = generate_latest(registry).decode()
    for line in ('overlord_role_recovered{role="planner"} 1.0', "overlord_planner_steps_planned_total 10.0",
                 'overlord_planner_active_loader_actors{source="web"} 3.0',
                 'overlord_planner_reregistrations_total{role="loader"} 2.0',
                 'overlord_planner_mixture_realized{source="web"} 1.0'):
        assert line in text, line


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive free ports below the OS's ephemeral range: the roles' Flight servers
    bind port 0, and a port the OS may hand them must not be one the metrics pages are told to take."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(100):
        base = rng.randrange(max(1024, low - 12000), low - n)
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + n):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError(f"no {n} consecutive free ports below {low}")


def test_single_node_serves_each_role_s_page_on_its_own_port_from_the_configured_one(corpus, tmp_path):
    """``deployment: single_node`` with ``metrics: {port: P}``: the Planner at P, the two loader hosts and
    the constructor it hosts at P+1.. (in ``roles`` order), each page its role's; before, every role
    bound P and the process did not start."""
    base = free_ports(4)
    path = write_config(tmp_path, corpus, deployment="single_node", metrics={"port": base}, loader={"hosts": 2})
    with LocalCluster(path) as cluster:
        assert [c.name for c in cluster.children] == ["node"]
        flight_ports = previous_ports(load_config(path))  # each hosted role's Flight port, by name
        for offset, name in enumerate(["planner", "loader-host0", "loader-host1", "constructor-0"]):
            location = f"grpc://127.0.0.1:{flight_ports[name]}"
            url = status(location, cluster.credentials)["metrics"]
            assert url == f"http://127.0.0.1:{base + offset}/metrics", (name, url)
            assert pick(scrape(url), "overlord_role_up", role=name.split("-")[0], address=location) == 1
