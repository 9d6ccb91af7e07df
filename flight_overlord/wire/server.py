"""The one Flight server base every role uses, its client pool and its lifecycle helpers."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow.flight as fl

from ..errors import Busy, OverlordError, WaitTimedOut
from ..fence import Fence
from . import call, decode, encode
from .security import CLUSTER, INSPECT, MIDDLEWARE_KEY, Credentials, Security

log = logging.getLogger(__name__)


HANDLERS = ("do_get", "do_action", "get_flight_info", "get_schema", "list_flights", "list_actions", "do_put",
            "do_exchange")
MAX_ACTION_BODY = 1 << 20  # bytes; an action body is a small JSON object


def decode_body(raw: bytes, what: str):
    """A request's JSON body (an action's, a message on a plans stream), of at most ``MAX_ACTION_BODY`` bytes."""
    if len(raw) > MAX_ACTION_BODY:
        raise ValueError(f"{what} is {len(raw):,} bytes, over the {MAX_ACTION_BODY:,} limit")
    return decode(raw, what)


def client_error(exc: BaseException, where: str) -> fl.FlightError:
    """What a client gets for an exception in a handler: its message, never the server's traceback.
    Flight errors (time-outs, auth) pass through; a bad request says what is wrong; anything else is
    logged here with its traceback and reported as an internal error."""
    if isinstance(exc, fl.FlightError):
        return type(exc)(_bounded(str(exc)))
    if isinstance(exc, WaitTimedOut):  # a logic class's bounded wait: the client asks again
        return fl.FlightTimedOutError(_bounded(str(exc)))
    if isinstance(exc, Busy):
        return fl.FlightServerError(_bounded(str(exc)))
    if isinstance(exc, (ValueError, TypeError, ArithmeticError, RecursionError)):
        return fl.FlightServerError(_bounded(f"invalid request: {exc}"))
    if isinstance(exc, KeyError):
        return fl.FlightServerError(_bounded(f"not found: {exc.args[0] if exc.args else exc}"))
    log.error("%s failed", where, exc_info=exc)
    return fl.FlightServerError(_bounded(f"internal error in {where}: {type(exc).__name__}: {exc} "
                                         f"(details in the server log)"))


MAX_ERROR = 1000  # characters of an error message: gRPC drops status metadata over 8-16 KiB


def _bounded(message: str) -> str:
    """An error message echoes the request at most this much, so the refusal itself always arrives."""
    if len(message) <= MAX_ERROR:
        return message
    return f"{message[:MAX_ERROR]}... ({len(message):,} characters in all)"


def _guarded(name: str, handler: Callable) -> Callable:
    eager = name in ("list_flights", "do_action", "list_actions")  # generators: run them here, while the
    # call's context (and its caller identity) is certainly alive, and so that errors surface as the call's

    def call_handler(self, context, *args):
        if self.fence is not None:
            self.fence.enforce()  # a process that was replaced answers nothing (fence.py)
        try:
            result = handler(self, context, *args)
            return list(result) if eager and result is not None else result
        except BaseException as exc:
            raise client_error(exc, f"{type(self).__name__}.{name}") from None
    return call_handler


class ActionServer(fl.FlightServerBase):
    """The base of every role's Flight adapter. Actions are methods ``action_<name>(body: dict) ->
    JSON-able``, marked with the role they need (``@requires(TRAINER)``; unmarked: the cluster
    secret); other handlers call ``self.authorize(context, ROLE, what)`` first. Every handler a
    subclass defines is wrapped so that a client's bad request gets a clear error naming what is
    wrong, and never a traceback, and the server stays up."""

    fence: Fence | None = None  # this process's claim on its role, checked on every call (``fence.py``)

    def __init__(self, host: str, port: int, security: Security):
        self.security = security  # before super().__init__: Flight may accept calls during it
        super().__init__(f"{security.scheme}://{host}:{port}", **security.server_options())

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in HANDLERS:
            if name in cls.__dict__:
                setattr(cls, name, _guarded(name, cls.__dict__[name]))

    def authorize(self, context, needed: str, what: str, *, rank: int | None = None) -> None:
        """Raise FlightUnauthenticatedError / FlightUnauthorizedError unless the caller may make a
        call that needs role ``needed`` (for ``rank``: a rank-bound trainer token must cover it)
        (``wire.security``)."""
        self.security.authorize(context.get_middleware(MIDDLEWARE_KEY), needed, what, rank=rank)

    def _actions(self) -> list[tuple[str, Callable]]:
        return [(name[len("action_"):], getattr(self, name)) for name in sorted(dir(self))
                if name.startswith("action_")]

    def list_actions(self, context):
        self.authorize(context, INSPECT, "list_actions")
        return [(name, f"{(fn.__doc__ or '').strip().split(chr(10))[0]} [needs: {getattr(fn, 'role', CLUSTER)}]")
                for name, fn in self._actions()]

    def do_action(self, context, action):
        handler = getattr(self, f"action_{action.type}", None)
        what = f"action {action.type!r}"
        if handler is None:
            self.authorize(context, INSPECT, what)
            known = ", ".join(name for name, _ in self._actions())
            raise KeyError(f"unknown action {action.type!r} (known: {known})")
        self.authorize(context, getattr(handler, "role", CLUSTER), what)
        body = decode_body(action.body.to_pybytes() or b"{}", f"body of action {action.type!r}")
        rank_field = getattr(handler, "rank_field", None)
        if rank_field and isinstance(body, dict) and isinstance(body.get(rank_field), int):
            self.authorize(context, handler.role, what, rank=body[rank_field])
        result = handler(body)  # JSON-able, or bytes already encoded (a result made once, served many times)
        return [] if result is None else [fl.Result(result if isinstance(result, bytes) else encode(result))]

    def do_put(self, context, descriptor, reader, writer):
        raise fl.FlightServerError("not supported: no role of flight_overlord accepts do_put")

    def do_exchange(self, context, descriptor, reader, writer):
        raise fl.FlightServerError("not supported: no role of flight_overlord accepts do_exchange")


for _name in ("do_action", "list_actions", "do_put", "do_exchange"):
    setattr(ActionServer, _name, _guarded(_name, ActionServer.__dict__[_name]))


def refusal(exc: BaseException) -> str:
    """A server's refusal as one line: its message without the transport's detail and gRPC debug context."""
    text = str(exc)
    for marker in (". Detail:", ". gRPC client debug context:", "\n"):
        text = text.split(marker)[0]
    return text


def connect(location: str, credentials: Credentials | None = None) -> fl.FlightClient:
    """The one place this package opens a Flight client: with ``credentials`` it carries their
    bearer token on every call and, for ``grpc+tls://``, their CA and client certificate."""
    return fl.FlightClient(location, **(credentials.client_options(location) if credentials else {}))


class ClientPool:
    """One reusable Flight client per location (clients are thread-safe), each made by
    :func:`connect` with the pool's ``credentials``."""

    def __init__(self, credentials: Credentials | None = None):
        self.credentials = credentials
        self._clients: dict[str, fl.FlightClient] = {}
        self._lock = threading.Lock()

    def get(self, location: str) -> fl.FlightClient:
        with self._lock:
            if location not in self._clients:
                self._clients[location] = connect(location, self.credentials)
            return self._clients[location]

    def forget(self, location: str) -> None:
        """Drop the client of a location that did not answer: the next ``get`` connects afresh rather
        than waiting out gRPC's reconnect back-off on the old channel (a restarted role is back at once).
        It is not closed here: other threads may be mid-call on it (several loader actors share a
        process's address); it closes when the last of them lets go of it."""
        with self._lock:
            self._clients.pop(location, None)

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()


def location_of(server: fl.FlightServerBase, host: str) -> str:
    """``grpc://HOST:PORT``, or ``grpc+tls://`` for a server with TLS."""
    security = getattr(server, "security", None)
    return f"{security.scheme if security else 'grpc'}://{host}:{server.port}"


# After SIGINT, a role's handlers get this long to end; then the process exits without them. A handler
# may wait much longer: a Planner's plans stream on a constructor blocked in a loader fetch (call_any
# retries for ROLE_DOWN_SECONDS), a stuck client's stream. Nothing journaled is lost: journals are written and
# flushed record by record (journal.py), as a kill -9 needs; only the calls in flight are cut.
SHUTDOWN_GRACE_SECONDS = 5.0
FORCED_EXIT_STATUS = 130  # the shell's status of a process ended by SIGINT


def serve(server: fl.FlightServerBase, location: str, ready_file: str | None, *,
          hosted: tuple[fl.FlightServerBase, ...] = ()) -> None:
    """Announce ``location`` (atomically, in ``ready_file``) and block until SIGINT (SIGTERM ends the
    process). ``hosted``: further servers of this process, shut down first (in reverse order), ``server`` last;
    all within ``SHUTDOWN_GRACE_SECONDS``, else the process exits with ``FORCED_EXIT_STATUS``."""
    log.info("serving at %s", location)
    # Not FlightServerBase.serve(): on SIGINT it shuts the server down itself, waiting for every handler
    # before ours can tell a long-lived one to end (the Planner's plans streams, wire/plan_channel.py).
    # Installed before the ready file is written: whoever reads that file may send SIGINT at once.
    interrupted = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    if ready_file:
        tmp = Path(f"{ready_file}.tmp.{os.getpid()}")
        tmp.write_text(location)
        tmp.replace(ready_file)
    interrupted.wait()
    log.info("shutting down %s", location)
    failed: list[BaseException] = []

    def shut_down() -> None:
        try:
            for one in (*reversed(hosted), server):
                one.shutdown()
        except BaseException as exc:  # raised below, in the main thread, as an unbounded shutdown raises it
            failed.append(exc)
    stopping = threading.Thread(target=shut_down, name="shutdown", daemon=True)
    stopping.start()
    stopping.join(SHUTDOWN_GRACE_SECONDS)
    if stopping.is_alive():
        log.warning("%s: handlers still busy %.0f s after SIGINT (a peer or client that does not answer); exiting "
                    "without them (the journals are complete)", location, SHUTDOWN_GRACE_SECONDS)
        logging.shutdown()
        os._exit(FORCED_EXIT_STATUS)  # sys.exit would wait for the server's threads
    if failed:
        raise failed[0]


RETRY_SECONDS = 0.05  # between tries of an unreachable role: a local connect costs ~1 ms
REGISTER_SECONDS = 20.0  # a starting role waits this long for the Planner to come up
ROLE_DOWN_ENV = "OVERLORD_ROLE_DOWN_SECONDS"  # overrides the default below (a test of a failure bounds its wait)


def _role_down_seconds() -> float:
    """call_any's default bound: 120 s, or ``ROLE_DOWN_ENV``'s positive number of seconds."""
    text = os.environ.get(ROLE_DOWN_ENV, "120")
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{ROLE_DOWN_ENV}={text!r}: must be a positive number of seconds")
    return seconds


ROLE_DOWN_SECONDS = _role_down_seconds()


class RoleDown(OverlordError, ConnectionError):
    """Every replica of a role stayed unreachable for the whole retry window."""


def call_any(pool: "ClientPool", locations: list[str] | Callable[[], list[str]], fn: Callable[[fl.FlightClient], Any],
             *, what: str, timeout: float | None = None, stop: Callable[[], bool] = lambda: False) -> Any:
    """``fn(client)`` on the first location that answers, the others in order on
    ``FlightUnavailableError``; all of them again every ``RETRY_SECONDS`` (on fresh connections) until
    ``timeout`` (default ``ROLE_DOWN_SECONDS``). This is how a role rides out a peer's restart (same address:
    a restart takes a fraction of a second, so the retry polls rather than backs off) or fails over to a
    shadow. ``locations`` may be a function giving the current addresses: it is asked again before each
    round, so a peer that came back on a new address (and re-registered) is found within a retry."""
    timeout = ROLE_DOWN_SECONDS if timeout is None else timeout
    resolve = locations if callable(locations) else lambda: locations
    deadline, since = time.monotonic() + timeout, time.time()
    while True:
        tried = resolve()
        for index, location in enumerate(tried):
            try:
                return fn(pool.get(location))
            except DeadlinePassed as exc:  # hung, or gone without a word: say so (a refusal is routine)
                pool.forget(location)
                log.warning("%s at %s: %s; %s", what, location, exc,
                            "trying the next replica" if index + 1 < len(tried) else "asking again")
            except fl.FlightUnavailableError:
                pool.forget(location)
        if time.monotonic() > deadline or stop():
            raise RoleDown(f"{what}: unreachable at {', '.join(tried)} since "
                           f"{time.strftime('%H:%M:%S', time.localtime(since))} ({timeout:.0f}s)")
        time.sleep(RETRY_SECONDS)


ANSWERED, SILENT, REFUSED = "answered", "silent", "refused"


def probe(client: fl.FlightClient, timeout: float) -> str:
    """Whether a role's server is there at all: a trivial call (``list_actions``, which its gRPC threads
    answer beside any work it is doing) under ``timeout``. ``ANSWERED``: any reply, an error too;
    ``REFUSED``: nothing listens (a dead process, or one not started yet); ``SILENT``: a server took the
    call and let the deadline pass (hung)."""
    try:
        client.list_actions(options=fl.FlightCallOptions(timeout=timeout))
        return ANSWERED
    except fl.FlightUnavailableError:
        return REFUSED
    except fl.FlightTimedOutError:
        return SILENT
    except Exception:  # noqa: BLE001 - an error is an answer: a server is there
        return ANSWERED


class DeadlinePassed(fl.FlightUnavailableError):
    """A peer let a call's deadline pass (``within``): unavailable as a refused connection is, but logged."""


def within(seconds: float, call: Callable[[fl.FlightCallOptions], Any]) -> Any:
    """``call(options)`` under a deadline of ``seconds`` (``liveness.fetch_seconds`` or ``call_seconds``):
    a peer that lets it pass did not answer at all (hung, or gone without a word), which is raised as
    ``FlightUnavailableError`` so that ``call_any`` moves on to the next replica (a shadow) or asks again. A
    server's own bounded wait, which times out well before the deadline, passes through as it was."""
    started = time.monotonic()
    try:
        return call(fl.FlightCallOptions(timeout=seconds))
    except fl.FlightTimedOutError:
        if time.monotonic() - started < seconds * 0.9:
            raise
        raise DeadlinePassed(f"no answer within the {seconds:g}s deadline") from None  # gRPC's text adds nothing


def ask_again(ask: Callable[[], Any], *, stop: Callable[[], bool] = lambda: False,
              deadline: float | None = None) -> Any:
    """``ask()`` again while the server's wait times out (``FlightTimedOutError``: it waited its share,
    the answer is still coming), until ``stop()`` (then None) or the ``time.monotonic()`` ``deadline``
    (then the last time-out is raised)."""
    while not stop():
        try:
            return ask()
        except fl.FlightTimedOutError:
            if deadline is not None and time.monotonic() > deadline:
                raise
    return None


def register(planner: str, body: dict, credentials: Credentials, *, call_seconds: float = 30.0) -> None:
    """Announce this role to the Planner, waiting for it to come up (processes start in any order).
    Registration needs the run's cluster secret (``credentials``); each try has ``call_seconds``."""
    pool = ClientPool(credentials)
    try:
        call_any(pool, [planner], lambda client: call(client, "register", body, timeout=call_seconds), what="planner",
                 timeout=REGISTER_SECONDS)
    finally:
        pool.close()
