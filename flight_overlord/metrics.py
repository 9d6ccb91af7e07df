"""Prometheus metrics of a role (optional: ``pip install flight_overlord[metrics]``).

With ``metrics: {port: P}`` in the config (or ``overlord serve ROLE --metrics-port P``) a role serves
``http://HOST:P/metrics`` (HOST: ``network.host``, the bind address; P = 0: any free port, which the
role's ``status`` action then names under ``"metrics"``). Nothing is counted twice: at each scrape the
role's own ``status`` answer (the counters ``overlord status`` shows) is turned into the metrics of
:data:`METRICS`, plus the process's CPU and memory (``process_*``). The page holds counters only, no
sample data and no secret; it has no authentication, so bind it where your monitoring can reach it.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable, NamedTuple

from .wire.status import ConstructorStatus, LoaderStatus, PlannerStatus

log = logging.getLogger(__name__)

# name -> (type, help, label names). README's metrics table lists the same names.
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "overlord_role_up": ("gauge", "1 while the role serves (its address in the labels)", ("role", "address")),
    "overlord_role_errors": ("gauge", "1 when the role reports an error (planning or assembly failed)", ("role",)),
    "overlord_role_recovered": ("gauge", "1 when this process rebuilt its state from the run's journals "
                                "(a restart or --resume)", ("role",)),
    "overlord_planner_steps_planned": ("counter", "steps planned (journaled)", ()),
    "overlord_planner_step_requested": ("gauge", "the step each rank asked for last", ("rank",)),
    "overlord_planner_samples_planned": ("counter", "samples planned, per source", ("source",)),
    "overlord_planner_tokens_planned": ("counter", "tokens planned, per source", ("source",)),
    "overlord_planner_mixture_realized": ("gauge", "each source's share of what was planned so far, in "
                                          "the unit the mixer weighs (tokens with tokens_per_step, else samples)",
                                          ("source",)),
    # the label "views" counts constructor plans: its name is what dashboards already query
    "overlord_planner_plan_answers": ("counter", "constructors' plan requests answered, by the steps' constructor "
                                      "plans an answer carried (2: the next step's came along, no request for it)",
                                      ("views",)),
    "overlord_planner_registered_roles": ("gauge", "loader replicas and constructors registered", ("role",)),
    "overlord_planner_reregistrations": ("counter", "registrations of a role already registered: restarts "
                                         "and recoveries of loaders and constructors", ("role",)),
    "overlord_planner_active_loader_actors": ("gauge", "loader actors reading each source (loader.scaling moves "
                                              "it: every change is a scaling event)", ("source",)),
    "overlord_planner_cost_coefficient": ("gauge", "the cost model in force (a: per token, b: per token squared; "
                                          "seconds when fitted to the trainers' timings, cost.fit)", ("coefficient",)),
    "overlord_planner_cost_fitted": ("gauge", "1 when the cost model in force is fitted to trainer timings", ()),
    "overlord_loader_buffered_samples": ("gauge", "samples read ahead and not yet served", ("source", "actor")),
    "overlord_loader_buffered_row_groups": ("gauge", "row groups in the read-ahead buffer", ("source", "actor")),
    "overlord_loader_buffered_bytes": ("gauge", "bytes of the read-ahead buffer", ("source", "actor")),
    "overlord_loader_bytes_served": ("counter", "Arrow bytes of samples sent to constructors", ("source", "actor")),
    "overlord_loader_failed_reads": ("counter", "row groups skipped as unreadable (deleted, denied, corrupt): "
                                     "their samples are not planned", ("source", "actor")),
    "overlord_constructor_steps_assembled": ("counter", "steps assembled and staged", ("constructor",)),
    "overlord_constructor_bytes_fetched": ("counter", "Arrow bytes received from loaders", ("constructor",)),
    "overlord_constructor_bad_samples": ("counter", "samples skipped for a bad image", ("constructor",)),
    "overlord_constructor_step_served": ("gauge", "the last step served, per rank", ("rank",)),
    "overlord_constructor_batches_served": ("counter", "do_get streams served, per rank", ("rank",)),
    "overlord_constructor_samples_served": ("counter", "samples served (sample keys in the streams), per rank",
                                            ("rank",)),
    "overlord_constructor_bytes_served": ("counter", "Arrow bytes served to trainers, per rank", ("rank",)),
    "overlord_constructor_wait_seconds": ("gauge", "seconds a rank's recent batch requests waited for assembly, by "
                                          "the stage the constructor was in (plan, loader:SOURCE, loader network, "
                                          "assembly, other)", ("rank", "stage")),
}


class Sample(NamedTuple):
    name: str
    labels: dict
    value: float


def planner_samples(raw: dict) -> Iterable[Sample]:
    """The Planner's ``status`` answer as metrics."""
    status = PlannerStatus.from_wire(raw)
    yield Sample("overlord_planner_steps_planned", {}, status.planned + 1)
    for rank, step in status.requested.items():
        yield Sample("overlord_planner_step_requested", {"rank": rank}, step)
    for source, n in status.samples_planned.items():
        yield Sample("overlord_planner_samples_planned", {"source": source}, n)
    for source, share in status.mixture_realized.items():
        yield Sample("overlord_planner_mixture_realized", {"source": source}, share)
    for source, n in status.tokens_planned.items():
        yield Sample("overlord_planner_tokens_planned", {"source": source}, n)
    yield Sample("overlord_planner_registered_roles", {"role": "loader"}, len(status.loaders))
    yield Sample("overlord_planner_registered_roles", {"role": "constructor"}, len(status.constructors))
    for role, n in status.reregistrations.items():
        yield Sample("overlord_planner_reregistrations", {"role": role}, n)
    for plans, n in status.plan_answers.items():
        yield Sample("overlord_planner_plan_answers", {"views": plans}, n)
    for source, n in (status.scaling or {}).get("actors", {}).items():
        yield Sample("overlord_planner_active_loader_actors", {"source": source}, n)
    cost = status.cost or {}
    for coefficient in ("a", "b"):
        if cost.get(coefficient) is not None:
            yield Sample("overlord_planner_cost_coefficient", {"coefficient": coefficient}, cost[coefficient])
    yield Sample("overlord_planner_cost_fitted", {}, 1 if cost.get("fitted") else 0)


def loader_samples(raw: dict) -> Iterable[Sample]:
    """A loader process's ``status`` answer (every actor it hosts) as metrics."""
    for actor in LoaderStatus.from_wire(raw).actors:
        labels = {"source": actor.source, "actor": actor.actor}
        for key in ("buffered_samples", "buffered_row_groups", "buffered_bytes", "bytes_served", "failed_reads"):
            yield Sample(f"overlord_loader_{key}", labels, getattr(actor, key))


def constructor_samples(raw: dict) -> Iterable[Sample]:
    """A constructor's ``status`` answer as metrics."""
    status = ConstructorStatus.from_wire(raw)
    labels = {"constructor": status.index}
    yield Sample("overlord_constructor_steps_assembled", labels, status.assembled + 1)
    yield Sample("overlord_constructor_bytes_fetched", labels, status.bytes_fetched)
    yield Sample("overlord_constructor_bad_samples", labels, len(status.bad_samples))
    for rank, served in status.served.items():
        yield Sample("overlord_constructor_step_served", {"rank": rank}, served["step"])
        for key in ("batches", "samples", "bytes"):
            yield Sample(f"overlord_constructor_{key}_served", {"rank": rank}, served[key])
    for rank, stages in status.waits.items():
        for stage, seconds in stages.items():
            yield Sample("overlord_constructor_wait_seconds", {"rank": rank, "stage": stage}, seconds)


ROLE_SAMPLES = {"planner": planner_samples, "loader": loader_samples, "constructor": constructor_samples}


class _Collector:
    """Builds every metric family from one ``status`` call at scrape time."""

    def __init__(self, role: str, address: str, status: Callable[[], dict]):
        self.role, self.address, self.status = role, address, status

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        status = self.status()
        samples = [Sample("overlord_role_up", {"role": self.role, "address": self.address}, 1),
                   Sample("overlord_role_errors", {"role": self.role}, 1 if status.get("error") else 0),
                   Sample("overlord_role_recovered", {"role": self.role}, 1 if status.get("recovered") else 0),
                   *ROLE_SAMPLES[self.role](status)]
        families = {}
        for name, labels, value in samples:
            kind, help_text, names = METRICS[name]
            if name not in families:
                cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                families[name] = cls(name, help_text, labels=names)
            families[name].add_metric([str(labels[n]) for n in names], float(value))
        yield from families.values()


def serve_metrics(port: int | None, host: str, role: str, address: str, status: Callable[[], dict], *,
                  url_host: str | None = None) -> str | None:
    """Serve ``role``'s metrics over HTTP on ``host:port`` (0: any free port); None when ``port`` is None.
    Returns the page's URL, at ``url_host`` (the advertised host) if given."""
    if port is None:
        return None
    try:
        from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
    except ImportError:
        raise SystemExit(f"{role}: metrics need prometheus-client: pip install flight_overlord[metrics] "
                         f"(or leave metrics.port unset)") from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(role, address, status))
    ProcessCollector(registry=registry)
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise SystemExit(f"{role}: cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    url = f"http://{_url_host(url_host or host)}:{server.server_port}/metrics"
    log.info("%s metrics at %s", role, url)
    return url


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
