"""The run's secrets and who may call what: bearer tokens in Flight middleware, signed tickets, TLS.

A caller is one of four identities, told by the ``authorization: Bearer <token>`` header:

- ``cluster``: the run's cluster secret. The roles themselves (register, plan, loader fetches)
  and the run's own tools (readiness check, status, inspection). It may do everything.
- ``trainer``: one of the tokens in ``security.trainer_tokens_file``: ticket requests, ``report``,
  redeeming tickets at a constructor, and inspection. A token line may bind the token to ranks
  (``TOKEN 0-7``): it then asks, reports and redeems for those ranks only.
- ``inspect``: the token in ``security.inspect_token_file``: read-only inspection.
- anonymous (no token, or one this run does not know).

Calls are of three kinds. Internal calls always need the cluster secret. Trainer calls are open to
anyone unless the config names trainer tokens; inspection calls are open unless it names an
inspection token (then a trainer token or the secret also do). No secret ever appears in a log line,
an error message or a ``repr``; tokens are compared with :func:`hmac.compare_digest`.

Tickets for a rank's data are signed by the Planner (HMAC-SHA256 with a key derived from the cluster
secret, over kind, step, rank and expiry) and checked where they are redeemed, so a ticket cannot
be forged or altered; it stays a JSON object a stock Flight client passes through unchanged.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets as _random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pyarrow.flight as fl

from ..core.ranks import RankSet
from .token_files import MIN_TOKEN_CHARS, SecurityError, read_pem, read_secret_file, read_tokens, read_trainer_tokens

if TYPE_CHECKING:
    from ..config import Config

CLUSTER, TRAINER, INSPECT = "cluster", "trainer", "inspect"
SECRET_ENV = "OVERLORD_CLUSTER_SECRET"      # how LocalCluster hands the secret to its children
TRAINER_TOKEN_ENV = "OVERLORD_TRAINER_TOKEN"
TLS_ENV = {"ca": "OVERLORD_TLS_CA", "cert": "OVERLORD_TLS_CERT", "key": "OVERLORD_TLS_KEY"}  # file paths
SECRETS_DIR = "secrets"                     # under run_dir, mode 0700
SECRET_FILE = "cluster-secret"              # mode 0600
AUTH_HEADER = "authorization"               # gRPC header keys are lowercase
MIDDLEWARE_KEY = "auth"

_WHO = {CLUSTER: "the run's cluster secret",
        TRAINER: "a trainer token (or the run's cluster secret)",
        INSPECT: "an inspection token, a trainer token or the run's cluster secret"}
_ROLE = {CLUSTER: "the cluster role (the run's cluster secret)", TRAINER: "the trainer role (a trainer token)",
         INSPECT: "the inspection role"}


def requires(role: str, *, rank_field: str | None = None) -> Callable:
    """Mark an ``action_<name>`` method with the role it needs (unmarked actions need the cluster secret);
    ``rank_field``: the body's field naming the rank acted for, checked against a rank-bound token."""
    if role not in _WHO:
        raise ValueError(f"unknown role {role!r}")

    def mark(fn):
        fn.role = role
        fn.rank_field = rank_field
        return fn
    return mark


# -- client side ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Credentials:
    """What a client presents: a bearer token, and TLS material (PEM bytes) for ``grpc+tls://``
    locations: the CA that signed the servers' certificates and, for mutual TLS, a client
    certificate and key. Nothing here is ever printed: the ``repr`` says only what is set."""
    token: str | None = field(default=None, repr=False)
    tls_root_certs: bytes | None = field(default=None, repr=False)
    cert_chain: bytes | None = field(default=None, repr=False)
    private_key: bytes | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return (f"Credentials(token={'<set>' if self.token else None}, "
                f"ca={'<set>' if self.tls_root_certs else None}, "
                f"client_cert={'<set>' if self.cert_chain else None})")

    @classmethod
    def from_files(cls, *, token: str | None = None, token_file: str | os.PathLike | None = None,
                   ca: str | os.PathLike | bytes | None = None, cert: str | os.PathLike | bytes | None = None,
                   key: str | os.PathLike | bytes | None = None) -> "Credentials":
        """Credentials from files (or PEM bytes): a token file holds the token on its first line."""
        if token is None and token_file is not None:
            token = read_tokens(Path(token_file), "token file")[0]
        if (cert is None) != (key is None):
            raise SecurityError("a client certificate needs its key and the other way round (cert and key)")
        return cls(token or None, read_pem(ca, "ca"), read_pem(cert, "cert"), read_pem(key, "key"))

    @classmethod
    def for_trainer(cls, token: str | None = None) -> "Credentials":
        """A trainer's credentials: ``token`` or ``$OVERLORD_TRAINER_TOKEN``; TLS files from
        ``$OVERLORD_TLS_CA``, ``$OVERLORD_TLS_CERT`` and ``$OVERLORD_TLS_KEY`` when set."""
        return cls.from_files(token=token or os.environ.get(TRAINER_TOKEN_ENV) or None,
                              **{k: os.environ.get(v) or None for k, v in TLS_ENV.items()})

    def with_token(self, token: str | None) -> "Credentials":
        return Credentials(token, self.tls_root_certs, self.cert_chain, self.private_key)

    def client_options(self, location: str) -> dict:
        """Keyword arguments of ``pyarrow.flight.FlightClient`` for ``location``."""
        options: dict = {}
        if self.token:
            options["middleware"] = [BearerClientFactory(self.token)]
        if location.startswith("grpc+tls://"):
            if self.tls_root_certs:
                options["tls_root_certs"] = self.tls_root_certs
            if self.cert_chain:
                options["cert_chain"], options["private_key"] = self.cert_chain, self.private_key
        return options

    def call_options(self, timeout: float | None = None) -> fl.FlightCallOptions:
        """For a stock client without middleware: the token as a per-call header."""
        headers = [(AUTH_HEADER.encode(), f"Bearer {self.token}".encode())] if self.token else None
        return fl.FlightCallOptions(timeout=timeout, headers=headers)


class BearerClientFactory(fl.ClientMiddlewareFactory):
    """Adds ``authorization: Bearer <token>`` to every call of the client it is installed in."""

    def __init__(self, token: str):
        self._headers = {AUTH_HEADER: f"Bearer {token}"}

    def start_call(self, info):
        return _Bearer(self._headers)

    def __repr__(self) -> str:
        return "BearerClientFactory(<token>)"


class _Bearer(fl.ClientMiddleware):
    def __init__(self, headers: dict):
        self._headers = headers

    def sending_headers(self):
        return self._headers


# -- server side ---------------------------------------------------------------------------------

class Caller(fl.ServerMiddleware):
    """Who is calling, for the handlers (``context.get_middleware("auth")``): ``identity`` is one
    of ``cluster``, ``trainer``, ``inspect`` or None; ``presented`` whether a token came at all;
    ``ranks`` the ranks a rank-bound trainer token may act for (None: any)."""

    def __init__(self, identity: str | None, presented: bool, ranks: RankSet | None = None):
        self.identity = identity
        self.presented = presented
        self.ranks = ranks


class AuthMiddlewareFactory(fl.ServerMiddlewareFactory):
    """Identifies every call's caller from its bearer token. It refuses nothing itself: what a call
    needs depends on the action or ticket kind, which only the handler knows (``Security.authorize``)."""

    def __init__(self, security: "Security"):
        self._security = security

    def start_call(self, info, headers):
        values = headers.get(AUTH_HEADER) or ()
        token = None
        for value in values:
            value = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            scheme, _, rest = value.partition(" ")
            if scheme.lower() == "bearer" and rest.strip():
                token = rest.strip()
                break
        identity, ranks = self._security.match(token)
        return Caller(identity, bool(values), ranks)


@dataclass(frozen=True)
class TLSMaterial:
    cert: bytes = field(repr=False)
    key: bytes = field(repr=False)
    ca: bytes | None = field(default=None, repr=False)
    verify_client: bool = False


class Security:
    """One process's view of the run's secrets: who a token is, what a call needs, ticket
    signatures, and the TLS settings of its server and of its internal clients."""

    def __init__(self, cluster_secret: str, *, trainer_tokens: tuple = (), inspect_token: str | None = None,
                 tls: TLSMaterial | None = None, ticket_ttl: float = 3600.0):
        """``trainer_tokens``: tokens, or (token, RankSet or None) pairs for tokens bound to ranks."""
        if not cluster_secret or len(cluster_secret) < MIN_TOKEN_CHARS:
            raise SecurityError(f"the cluster secret needs at least {MIN_TOKEN_CHARS} characters")
        self._secret = cluster_secret.encode()
        self._trainer = tuple((t.encode(), None) if isinstance(t, str) else (t[0].encode(), t[1])
                              for t in trainer_tokens)
        self._inspect = inspect_token.encode() if inspect_token else None
        self._ticket_key = hmac.new(self._secret, b"flight_overlord ticket v1", hashlib.sha256).digest()
        self.tls = tls
        self.ticket_ttl = float(ticket_ttl)
        self.trainer_open = not self._trainer
        self.inspect_open = self._inspect is None

    def __repr__(self) -> str:
        return (f"Security(trainer_tokens={len(self._trainer)}, inspect_token={not self.inspect_open}, "
                f"tls={'mutual' if self.tls and self.tls.verify_client else bool(self.tls)})")

    # -- from a config ---------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: "Config", secret: str | None = None) -> "Security":
        """``secret``: the cluster secret if the caller has it; else it is looked up as a role
        process does (:func:`cluster_secret`)."""
        sec = cfg.security
        if secret is None:
            secret, _ = cluster_secret(cfg)
        trainer = (read_trainer_tokens(sec.trainer_tokens_file, cfg.mesh.world_size)
                   if sec.trainer_tokens_file else ())
        inspect = (read_tokens(sec.inspect_token_file, "security.inspect_token_file")[0]
                   if sec.inspect_token_file else None)
        tls = None
        if sec.tls.on:
            tls = TLSMaterial(read_secret_file(sec.tls.cert, "security.tls.cert"),
                              read_secret_file(sec.tls.key, "security.tls.key"),
                              read_secret_file(sec.tls.ca, "security.tls.ca") if sec.tls.ca else None,
                              sec.tls.verify_client)
        return cls(secret, trainer_tokens=tuple(trainer), inspect_token=inspect, tls=tls,
                   ticket_ttl=sec.ticket_ttl_seconds)

    @property
    def scheme(self) -> str:
        return "grpc+tls" if self.tls else "grpc"

    @property
    def credentials(self) -> Credentials:
        """What this run's own clients present: the cluster secret, the CA, and under mutual TLS the
        role's certificate (``overlord certs`` gives it the client-auth usage too)."""
        tls = self.tls
        if tls is None:
            return Credentials(self._secret.decode())
        mutual = tls.verify_client
        return Credentials(self._secret.decode(), tls.ca, tls.cert if mutual else None, tls.key if mutual else None)

    def server_options(self) -> dict:
        """Keyword arguments of ``FlightServerBase``: the auth middleware, and TLS if configured."""
        options: dict = {"middleware": {MIDDLEWARE_KEY: AuthMiddlewareFactory(self)}}
        if self.tls:
            options["tls_certificates"] = [(self.tls.cert, self.tls.key)]
            if self.tls.verify_client:
                options["verify_client"] = True
                options["root_certificates"] = self.tls.ca
        return options

    # -- who is calling, and may they -------------------------------------------------------------
    def identify(self, token: str | None) -> str | None:
        return self.match(token)[0]

    def match(self, token: str | None) -> tuple[str | None, RankSet | None]:
        """The identity of ``token`` and, for a rank-bound trainer token, its ranks."""
        if not token:
            return None, None
        raw = token.encode()
        if hmac.compare_digest(raw, self._secret):
            return CLUSTER, None
        trainer, ranks = False, None
        for known, bound in self._trainer:  # no early exit: the time does not tell which token matched
            if hmac.compare_digest(raw, known):
                trainer, ranks = True, bound
        if trainer:
            return TRAINER, ranks
        if self._inspect is not None and hmac.compare_digest(raw, self._inspect):
            return INSPECT, None
        return None, None

    def authorize(self, caller: Caller | None, needed: str, what: str, *, rank: int | None = None) -> None:
        """Raise unless ``caller`` may make a call that needs ``needed`` (for ``rank``, when the call
        is for one rank's data): FlightUnauthenticatedError when it has no valid token (saying which
        one the call needs), FlightUnauthorizedError when its token is valid but of another role, or
        bound to other ranks (saying which)."""
        identity = caller.identity if caller is not None else None
        if identity == CLUSTER:
            return
        if needed == TRAINER and identity == TRAINER:
            if rank is not None and caller.ranks is not None and rank not in caller.ranks:
                raise fl.FlightUnauthorizedError(f"{what}: this trainer token is bound to ranks {caller.ranks}, "
                                                 f"not rank {rank}")
            return
        if needed == TRAINER and self.trainer_open:
            return
        if needed == INSPECT and (self.inspect_open or identity in (TRAINER, INSPECT)):
            return
        if identity is None:
            given = ("the token given is not valid for this run" if caller is not None and caller.presented
                     else "no token was given")
            raise fl.FlightUnauthenticatedError(f"{what}: this call needs {_WHO[needed]} ({given})")
        held = {TRAINER: "a trainer token", INSPECT: "an inspection token"}[identity]
        raise fl.FlightUnauthorizedError(f"{what}: this call needs {_ROLE[needed]}; {held} does not allow it")

    # -- tickets -----------------------------------------------------------------------------------
    def sign_ticket(self, kind: str, step: int, rank: int, *, expires: int | None = None) -> dict:
        """A ticket for one rank's data: JSON fields plus ``exp`` (unix seconds) and ``sig``."""
        exp = int(time.time() + self.ticket_ttl) if expires is None else int(expires)
        return {"kind": kind, "step": step, "rank": rank, "exp": exp, "sig": self._mac(kind, step, rank, exp)}

    def verify_ticket(self, request: dict) -> None:
        """FlightUnauthorizedError naming what is wrong with a batch/encoder ticket: unsigned,
        altered or forged (signature mismatch), or expired."""
        sig, exp = request.get("sig"), request.get("exp")
        if sig is None or exp is None:
            raise fl.FlightUnauthorizedError("ticket is not signed (no 'sig' or 'exp'): tickets for a rank's data "
                                             "come from the Planner's get_flight_info")
        if not isinstance(sig, str) or isinstance(exp, bool) or not isinstance(exp, int):
            raise fl.FlightUnauthorizedError("ticket signature is malformed: 'sig' must be a string and 'exp' an "
                                             "integer")
        expected = self._mac(request["kind"], request["step"], request["rank"], exp)
        if not hmac.compare_digest(expected.encode(), sig.encode(errors="replace")):
            raise fl.FlightUnauthorizedError("ticket signature does not match: the ticket was altered or was not "
                                             "issued by this run's Planner")
        now = time.time()
        if exp < now:
            raise fl.FlightUnauthorizedError(f"ticket expired {now - exp:.0f}s ago (security.ticket_ttl_seconds: "
                                             f"{self.ticket_ttl:g}): ask the Planner for a new one")

    def _mac(self, kind, step, rank, exp) -> str:
        message = f"{kind}\x00{step}\x00{rank}\x00{exp}".encode()
        return hmac.new(self._ticket_key, message, hashlib.sha256).hexdigest()


# -- the cluster secret --------------------------------------------------------------------------

def cluster_secret(cfg: "Config", *, create: bool = False) -> tuple[str, str]:
    """The run's cluster secret and where it came from: ``security.cluster_secret_file``, else
    ``$OVERLORD_CLUSTER_SECRET``; else, with ``create`` (``overlord up``), a fresh random one;
    else (a role process or tool of a run started elsewhere) ``run_dir/secrets/cluster-secret``."""
    sec = cfg.security
    if sec.cluster_secret_file is not None:
        return read_tokens(sec.cluster_secret_file, "security.cluster_secret_file")[0], "file"
    from_env = os.environ.get(SECRET_ENV, "").strip()
    if from_env:
        if len(from_env) < MIN_TOKEN_CHARS:
            raise SecurityError(f"${SECRET_ENV}: the cluster secret needs at least {MIN_TOKEN_CHARS} characters")
        return from_env, "env"
    if create:
        return _random.token_urlsafe(32), "fresh"
    stored = secret_path(cfg)
    if stored.is_file():
        return read_tokens(stored, str(stored))[0], "run_dir"
    raise SecurityError(f"no cluster secret: name a file in security.cluster_secret_file, set ${SECRET_ENV}, or start "
                        f"the run with `overlord up` (which writes one to {stored})")


def secret_path(cfg: "Config") -> Path:
    return cfg.run_dir / SECRETS_DIR / SECRET_FILE


def write_secret(path: Path, secret: str) -> None:
    """Write a secret readable by its owner only (directory 0700, file 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, secret.encode() + b"\n")
    finally:
        os.close(fd)
