"""Where a run's Planner answers, kept in its ``run_dir`` so that ``overlord up --resume`` comes back
there: trainers keep the address they were given (``$OVERLORD_PLANNER``) through a data-plane restart.

``network.planner_port: 0`` (any free port) picks a port at the run's first start; a resume asks for
that port again. A config that names another port, or a port taken meanwhile, is an error naming both
addresses, before any role starts.
"""
from __future__ import annotations

import socket
from pathlib import Path

from ..config import Config
from ..errors import ConfigError
from ..journal import write_text_atomic

ADDRESS_FILE = Path("planner") / "address"


def record(cfg: Config, location: str) -> None:
    """The Planner of the run in ``cfg.run_dir`` answers at ``location`` (after every start)."""
    write_text_atomic(cfg.run_dir / ADDRESS_FILE, location)


def previous(cfg: Config) -> str | None:
    path = cfg.run_dir / ADDRESS_FILE
    return path.read_text().strip() if path.exists() else None


def resume_port_args(cfg: Config) -> list[str]:
    """The Planner's ``--port`` flag for a resume: the run's previous port, unless the config fixes it
    (then it must be that port). Refuses, naming both addresses, when the Planner cannot come back
    where its trainers look."""
    before = previous(cfg)
    if before is None:
        return []
    port = int(before.rsplit(":", 1)[1])
    path = cfg.run_dir / ADDRESS_FILE
    asked = cfg.network.planner_port
    if asked and asked != port:
        raise ConfigError(f"the run's Planner was at {before} ({path}), where its trainers look, and the config "
                          f"asks for port {asked} ({before.rsplit(':', 1)[0]}:{asked}): set network.planner_port to "
                          f"{port} or 0 to come back where the trainers look, or remove {path} to move it (then give "
                          f"the trainers the new address)")
    if not port_is_free(cfg.network.host, port):
        raise ConfigError(f"the run's Planner was at {before} ({path}), where its trainers look, and port {port} of "
                          f"{cfg.network.host} is in use now: stop what holds it (a Planner of this run still "
                          f"running?), or remove {path} to start the Planner on another port (then give the "
                          f"trainers the new address)")
    return ["--port", str(port)]


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now (a socket in TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True
