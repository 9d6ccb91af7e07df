"""A hot standby Planner: a process started beside the Planner, its imports and config already
loaded, that takes the Planner's address over the moment the Planner is gone.

Gone is dead or hung. Dead: a connection to it is refused (nothing listens there any more). Hung: it
held no lease for ``liveness.hung_seconds``, a lease being any answer to the standby's probe (a
trivial call the Planner's gRPC threads answer beside its work, so a Planner busy planning still holds
it). A hung Planner is killed first (the standby runs on its host; the fence file names its pid), so
its port frees up and it can never wake up to serve; the standby then binds the port only once
connections are refused, so two Planners never serve one address, and claims the Planner's fence
(``fence.py``), so even a Planner it could not kill journals nothing more. On taking over it restores
like a restarted Planner (``--recover``): the latest snapshot plus the journal records after it (at
most ``checkpoint.every``), and the registrations of the live roles, so every rank's stream stays the
undisturbed run's. What it saves over a restart is the process start.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import time
from pathlib import Path

import psutil
import pyarrow.flight as fl

from ..config import Config
from ..fence import Fence
from ..wire.security import Credentials
from ..wire.server import ANSWERED, REFUSED, SILENT, connect, probe

log = logging.getLogger(__name__)
PROBE_SECONDS = 0.02  # between probes of the active Planner: a refused local connect costs well under 1 ms
REFUSALS = 2          # consecutive refusals that mean it is gone


def add_standby_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--standby-of", metavar="ADDRESS", help="a hot standby: wait until the Planner at "
                        "ADDRESS (grpc://HOST:PORT on this host) is gone, then serve on its port (--recover)")


def take_over_if_standby(args: argparse.Namespace, credentials: Credentials, cfg: Config) -> None:
    """Under ``--standby-of``: wait for the Planner to go, then serve on its port as a restart (--recover)."""
    if args.standby_of:
        await_takeover(args.standby_of, credentials, lease=cfg.liveness.hung_seconds, run_dir=cfg.run_dir,
                       starting_lease=cfg.liveness.silence_allowed(answered_once=False))
        args.port, args.recover = int(args.standby_of.rsplit(":", 1)[1]), True


def await_takeover(location: str, credentials: Credentials, *, lease: float = 0.0, run_dir: Path | None = None,
                   probe: float = PROBE_SECONDS, starting_lease: float | None = None) -> None:
    """Block until the Planner at ``location`` refuses ``REFUSALS`` connections in a row. With a
    ``lease`` (seconds, 0: none) a Planner that answers nothing for that long is killed on the way; one
    that has not answered this standby yet (a standby just promoted, still restoring) only after
    ``starting_lease`` (default: the lease)."""
    refused, held, answered = 0, time.monotonic(), False
    while refused < REFUSALS:
        time.sleep(probe)
        state = _probe(location, credentials, timeout=lease or 1.0)
        refused = refused + 1 if state == REFUSED else 0
        if state == ANSWERED:
            held, answered = time.monotonic(), True
        allowed = lease if answered or starting_lease is None else starting_lease
        if state == SILENT and lease and time.monotonic() - held > allowed and run_dir is not None:
            _kill_hung_planner(run_dir, location, time.monotonic() - held)
            held = time.monotonic()  # its death shows as refusals; a Planner that cannot be killed, as before
    log.warning("the Planner at %s is gone: this standby takes its address over", location)


def _probe(location: str, credentials: Credentials, timeout: float) -> str:
    """``probe`` on a fresh connection: a pooled one may be in reconnect back-off and hide a refusal."""
    try:
        client = connect(location, credentials)
    except fl.FlightUnavailableError:
        return REFUSED
    try:
        return probe(client, timeout)
    finally:
        client.close()


def _kill_hung_planner(run_dir: Path, location: str, silent: float) -> None:
    """SIGKILL the Planner process the fence names, if it runs on this host and is a Planner."""
    holder = Fence(run_dir, "planner").holder() or {}
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        log.warning("the Planner at %s has not answered for %.1fs, and it is not a process of this host: it "
                    "stays fenced only", location, silent)
        return
    try:
        if "planner" not in psutil.Process(pid).cmdline():
            return  # the pid was reused: whatever runs there is no Planner
        log.warning("the Planner at %s (pid %d) has not answered for %.1fs: it is hung; killing it", location, pid,
                    silent)
        os.kill(pid, signal.SIGKILL)
    except (psutil.NoSuchProcess, ProcessLookupError, PermissionError, psutil.AccessDenied):
        pass
