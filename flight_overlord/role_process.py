"""What every role process shares: the address it binds to vs the one it is reached at, and its metrics page.

A role binds its Flight server to ``network.host`` and tells the Planner (which puts it in tickets)
``network.advertise``, or ``overlord serve ROLE --advertise HOST``; without either it is reached at
``network.host``. On a multi-node deployment bind to ``0.0.0.0`` (or the node's own interface) and
advertise the name or IP other nodes reach this one at.
"""
from __future__ import annotations

import argparse

from .config import Config
from .config.fields import check_host
from .metrics import serve_metrics

WILDCARDS = ("0.0.0.0", "::", "")


def role_parser(role: str, *, planner: bool = True) -> argparse.ArgumentParser:
    """``overlord serve ROLE``'s flags every role has: its config, where it listens and announces
    itself, the Planner it registers with (``planner``), and the serving flags below."""
    parser = argparse.ArgumentParser(prog=f"overlord serve {role}")
    parser.add_argument("--config", required=True)
    if planner:
        parser.add_argument("--planner", required=True, help="grpc://host:port (or grpc+tls://) of the Planner")
        parser.add_argument("--port", type=int, default=0)
    else:
        parser.add_argument("--port", type=int, help="default: network.planner_port of the config (0: any free port)")
    parser.add_argument("--ready-file")
    add_serving_args(parser)
    return parser


def add_serving_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--advertise", metavar="HOST", help="the host name or IP other roles and trainers reach "
                        "this process at (default: network.advertise, else network.host, the bind address)")
    parser.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics at "
                        "http://HOST:PORT/metrics (0: any free port; default: metrics.port of the config)")


def advertised_host(cfg: Config, args: argparse.Namespace) -> str:
    """The host this role is reached at: ``--advertise``, else ``network.advertise``, else ``network.host``."""
    if args.advertise is not None:
        try:
            return check_host(args.advertise, "--advertise")
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
    host = cfg.network.advertise or cfg.network.host
    if host in WILDCARDS:
        raise SystemExit(f"error: network.host {cfg.network.host!r} binds every interface, so it is no address "
                         f"to reach this process at: set network.advertise in the config, or pass "
                         f"--advertise HOST (the name or IP other nodes reach this one at)")
    return host


def start_metrics(server, cfg: Config, args: argparse.Namespace, role: str, location: str) -> None:
    """Serve ``server``'s metrics if asked (``--metrics-port``, else ``metrics.port``); the role's status
    then names the page (``server.metrics_url``)."""
    port = args.metrics_port if args.metrics_port is not None else cfg.metrics.port
    if port is not None and not 0 <= port <= 65535:
        raise SystemExit(f"error: --metrics-port {port}: not a port (0..65535)")
    host = location.split("://", 1)[1].rsplit(":", 1)[0]
    server.metrics_url = serve_metrics(port, cfg.network.host, role, location, lambda: server.action_status({}),
                                       url_host=host)
