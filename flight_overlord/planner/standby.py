"""A hot standby Planner: a process started beside the Planner, its imports and config already
loaded, that takes the Planner's address over the moment the Planner stops answering.

It binds the port only once a connection to it is refused (nothing listens there any more: the
process died), never on a slow answer or a time-out, so two Planners never serve one address. On
taking over it restores like a restarted Planner (``--recover``): the latest snapshot plus the
journal records after it (at most ``checkpoint.every``), and the registrations of the live roles, so
every rank's stream stays the undisturbed run's. What it saves over a restart is the process start.
"""
from __future__ import annotations

import argparse
import logging
import time

import pyarrow.flight as fl

from ..wire.security import Credentials
from ..wire.server import connect

log = logging.getLogger(__name__)
PROBE_SECONDS = 0.02  # between probes of the active Planner: a refused local connect costs well under 1 ms
REFUSALS = 2          # consecutive refusals that mean it is gone


def add_standby_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--standby-of", metavar="ADDRESS", help="a hot standby: wait until the Planner at "
                        "ADDRESS (grpc://HOST:PORT on this host) is gone, then serve on its port (--recover)")


def take_over_if_standby(args: argparse.Namespace, credentials: Credentials) -> None:
    """Under ``--standby-of``: wait for the Planner to go, then serve on its port as a restart (--recover)."""
    if args.standby_of:
        await_takeover(args.standby_of, credentials)
        args.port, args.recover = int(args.standby_of.rsplit(":", 1)[1]), True


def await_takeover(location: str, credentials: Credentials, *, probe: float = PROBE_SECONDS) -> None:
    """Block until the Planner at ``location`` refuses ``REFUSALS`` connections in a row."""
    refused = 0
    while refused < REFUSALS:
        time.sleep(probe)
        refused = refused + 1 if _refused(location, credentials) else 0
    log.warning("the Planner at %s is gone: this standby takes its address over", location)


def _refused(location: str, credentials: Credentials) -> bool:
    try:
        client = connect(location, credentials)
    except fl.FlightUnavailableError:
        return True
    try:
        client.list_actions(options=fl.FlightCallOptions(timeout=1.0))
        return False
    except fl.FlightUnavailableError:
        return True
    except Exception:  # noqa: BLE001 - any other answer (an error, a time-out) means a server is there
        return False
    finally:
        client.close()
