"""``overlord serve node``: every role of a ``deployment: single_node`` run in one process.

The Planner, the loader process(es) and the constructor(s) of :func:`.topology.roles` each run their
own Flight server on their own port, as they would in their own processes (the same start functions,
flags, registrations and journals), so the plans and streams are the same; the process costs its
interpreter, pyarrow and the rest once instead of once per role (~35 MiB each:
docs/methods/memory-peers.md). The process announces the Planner's address. Restarted after a crash
(``--recover``), every role comes back on the port it had, which ``run_dir/node-ports.json`` keeps,
and rebuilds its state from the run's journals and snapshots as a restarted role process does.
"""
from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path

from .. import allocator, wire
from ..config import Config, load_config
from ..journal import write_json_atomic
from ..planner.catalogs import CatalogCache
from ..planner.roster import ROSTER_FILE, Roster
from ..role_process import advertised_host, role_parser
from ..wire.server import serve
from .topology import hosts_every_role, roles

PORTS_FILE = "node-ports.json"
log = logging.getLogger(__name__)


def main(argv=None) -> None:
    parser = role_parser("node", planner=False)  # --port, --advertise: the Planner's; --metrics-port: metrics_ports
    parser.add_argument("--resume", action="store_true", help="continue the run in run_dir from its journal")
    parser.add_argument("--recover", action="store_true", help="a restart of this process: --resume, every "
                        "role on the port it had")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    if not hosts_every_role(cfg):  # a standby or shadow inside the process it stands in for would die with it
        raise SystemExit(f"error: overlord serve node: {args.config} needs 'deployment: single_node' without "
                         "planner.standbys or loader.shadows; serve its roles one by one instead")
    advertised_host(cfg, args)  # a wrong --advertise is an error before any role starts
    allocator.tame()  # before any role's threads make malloc arenas (the loader's own call would come too late)
    specs = roles(cfg)[1:]
    metrics = metrics_ports(args.metrics_port if args.metrics_port is not None else cfg.metrics.port,
                            ["planner", *(spec.name for spec in specs)])
    ports = previous_ports(cfg) if args.recover else {}
    if args.port is not None:
        ports["planner"] = args.port
    restore = ["--recover"] if args.recover else ["--resume"] if args.resume else []
    planner, location, _ = _start("planner", [*_flags(args, ports, "planner"), *metrics["planner"], *restore])
    hosted = {}
    for spec in specs:
        hosted[spec.name] = _start(spec.role, [*spec.args, *_flags(args, ports, spec.name), *metrics[spec.name],
                                               "--planner", location])[0]
    _write_ports(cfg, {"planner": planner.port, **{name: server.port for name, server in hosted.items()}})
    serve(planner, location, args.ready_file, hosted=tuple(hosted.values()))


def _start(role: str, argv: list[str]):
    """A role's ``start``: its server up (and registered with the Planner): (server, location, ready file)."""
    return importlib.import_module(f"flight_overlord.{role}.server").start(argv)


def metrics_ports(port: int | None, names: list[str]) -> dict[str, list[str]]:
    """Each hosted role's ``--metrics-port``: ``port`` (``--metrics-port``, else ``metrics.port``) for the
    first, the Planner, and the next ones for the others, in ``roles`` order, so that each role serves the
    page it would serve in its own process (the ``process_*`` metrics are then the node's on each); 0:
    each any free port (its ``status`` names it); None: no metrics."""
    if port is None:
        return {name: [] for name in names}
    if port and port + len(names) - 1 > 65535:
        raise SystemExit(f"error: overlord serve node: metrics port {port}: its {len(names)} roles need ports "
                         f"{port}..{port + len(names) - 1}, beyond 65535")
    return {name: ["--metrics-port", str(port + i if port else 0)] for i, name in enumerate(names)}


def _flags(args, ports: dict[str, int], name: str) -> list[str]:
    """Every hosted role's: the config, the port it had (a restart), the host it is reached at."""
    return ["--config", args.config, *(["--port", str(ports[name])] if name in ports else []),
            *(["--advertise", args.advertise] if args.advertise is not None else [])]


def previous_ports(cfg: Config) -> dict[str, int]:
    """The port of every role of the process this one restarts ({} if none was written). Where
    ``node-ports.json`` does not parse (edited by hand, a disk fault), the hosted roles' ports come
    from the Planner's registrations instead (the Planner's own: the restart's ``--port``): roles on new
    OS-chosen ports could take one another's old ports, and the recovered Planner refuses a registration
    at an address that another of its roles still holds (a moved loader alone is found again)."""
    path = Path(cfg.run_dir) / PORTS_FILE
    if not path.exists():
        return {}
    try:
        return _checked(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, AttributeError) as exc:  # unreadable, not JSON, not port numbers
        log.warning("%s is unreadable (%s); the roles take the ports the Planner registered them at (%s)",
                    path, exc, ROSTER_FILE)
        return registered_ports(cfg, why=f"{path} is unreadable ({exc})")


def registered_ports(cfg: Config, *, why: str) -> dict[str, int]:
    """The port of every hosted role, from the Planner's registrations in ``run_dir`` (``why``: why they are asked)."""
    path = Path(cfg.run_dir) / ROSTER_FILE
    roster = Roster(cfg, cfg.num_constructors, CatalogCache(cfg))
    try:
        roster.load_state_dict(wire.decode(path.read_bytes(), str(path)))  # as the Planner reads it
        return _checked({spec.name: (roster.locations(spec.actors[0])[spec.replica] if spec.role == "loader"
                                     else roster.constructors[spec.index]).rsplit(":", 1)[1]
                         for spec in roles(cfg)[1:]})
    except (OSError, ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        raise SystemExit(f"error: overlord serve node --recover: {why}, and the roles' ports are not in {path} "
                         f"either ({type(exc).__name__}: {exc}); continue the run with --resume instead "
                         f"(its roles on new ports)") from None


def _checked(ports: dict) -> dict[str, int]:
    ports = {str(name): int(port) for name, port in ports.items()}
    if not all(0 < port <= 65535 for port in ports.values()):
        raise ValueError(f"a port out of 1..65535 in {ports}")
    return ports


def _write_ports(cfg: Config, ports: dict[str, int]) -> None:
    write_json_atomic(Path(cfg.run_dir) / PORTS_FILE, ports)
