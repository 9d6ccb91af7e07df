"""What security costs: TLS, mutual TLS and the bearer-token middleware, per call and on do_get.

One server process per variant, one client (this process), loopback: plaintext with no middleware
(stock pyarrow), plaintext + auth, TLS, TLS + auth, mutual TLS + auth; the rounds interleave them.
"auth" is the project's own path: an ``ActionServer`` with the auth middleware and a trainer token
configured (every call checked), and a client made by ``wire.server.connect`` whose middleware adds
the header. For each variant: connect + first call, the latency of a tiny ``do_action`` (median and
p90), and ``do_get`` throughput of 4 MiB batches (median of rounds). Then HMAC-SHA256 ticket
signing and verification, in process.

    .venv/bin/python -m benchmarks.security.overhead [--calls 4000] [--mib 256] [--repeats 9]
"""
from __future__ import annotations

import multiprocessing as mp
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from benchmarks.common import benchlib
from flight_overlord.deploy.certs import make_certs
from flight_overlord.wire.security import TRAINER, Credentials, Security, TLSMaterial, requires
from flight_overlord.wire.server import ActionServer, connect

BATCH = 4 << 20  # bytes per record batch
VARIANTS = [  # name, tls, mutual, auth
    ("plaintext", False, False, False),
    ("plaintext + auth", False, False, True),
    ("TLS", True, False, False),
    ("TLS + auth", True, False, True),
    ("mutual TLS + auth", True, True, True),
]


def _table(total: int) -> pa.Table:
    rows = BATCH // 8
    batches = [pa.record_batch([pa.array(np.arange(rows, dtype=np.int64) + i)], names=["x"])
               for i in range(max(1, total // BATCH))]
    return pa.Table.from_batches(batches)


class Bare(fl.FlightServerBase):
    """Stock pyarrow: no middleware, no checks."""

    def __init__(self, location: str, table: pa.Table, **options):
        self.table = table
        super().__init__(location, **options)

    def do_action(self, context, action):
        return [b"ok"]

    def do_get(self, context, ticket):
        return fl.RecordBatchStream(self.table)


class Guarded(ActionServer):
    """The project's server base: auth middleware, every call authorized as a trainer call."""

    def __init__(self, host: str, table: pa.Table, security: Security):
        self.table = table
        super().__init__(host, 0, security)

    @requires(TRAINER)
    def action_ping(self, body):
        return None

    def do_get(self, context, ticket):
        self.authorize(context, TRAINER, "do_get")
        return fl.RecordBatchStream(self.table)


def _serve(conn, tls: bool, mutual: bool, auth: bool, certs: dict, token: str, total: int) -> None:
    table = _table(total)
    pem = {k: Path(v).read_bytes() for k, v in certs.items()}
    if auth:
        material = TLSMaterial(pem["server.pem"], pem["server.key"], pem["ca.pem"], mutual) if tls else None
        server = Guarded("127.0.0.1", table, Security(secrets.token_urlsafe(32), trainer_tokens=(token,),
                                                      tls=material))
        scheme = server.security.scheme
    else:
        options = {"tls_certificates": [(pem["server.pem"], pem["server.key"])]} if tls else {}
        if mutual:
            options.update(verify_client=True, root_certificates=pem["ca.pem"])
        scheme = "grpc+tls" if tls else "grpc"
        server = Bare(f"{scheme}://127.0.0.1:0", table, **options)
    conn.send(f"{scheme}://127.0.0.1:{server.port}")
    conn.recv()  # until the client is done
    server.shutdown()


def _client(location: str, tls: bool, mutual: bool, auth: bool, certs: dict, token: str) -> fl.FlightClient:
    pem = {k: Path(v).read_bytes() for k, v in certs.items()}
    credentials = Credentials(token if auth else None, pem["ca.pem"] if tls else None,
                              pem["client.pem"] if mutual else None, pem["client.key"] if mutual else None)
    return connect(location, credentials)


def _start(variant, certs: dict, token: str, mib: int):
    _, tls, mutual, auth = variant
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(there, tls, mutual, auth, certs, token, mib << 20), daemon=True)
    proc.start()
    return proc, here, here.recv()


def _round(variant, location: str, client: fl.FlightClient, certs: dict, token: str, calls: int) -> dict:
    """One measurement of each figure for one variant."""
    name, tls, mutual, auth = variant
    action = fl.Action("ping" if auth else "x", b"{}")
    started = time.perf_counter()  # connect + first call, on a fresh channel
    fresh = _client(location, tls, mutual, auth, certs, token)
    list(fresh.do_action(action))
    first = time.perf_counter() - started
    fresh.close()
    latencies = []
    for _ in range(calls):
        started = time.perf_counter()
        list(client.do_action(action))
        latencies.append(time.perf_counter() - started)
    started = time.perf_counter()
    reader = client.do_get(fl.Ticket(b"all"))
    nbytes = 0
    while True:
        try:
            nbytes += reader.read_chunk().data.nbytes
        except StopIteration:
            break
    return {"first": first, "latencies": latencies, "rate": nbytes / (time.perf_counter() - started) / 2**20}


def measure_all(certs: dict, args) -> list[dict]:
    """Every variant's server up at once; the rounds interleave the variants, so that load from
    elsewhere on the machine hits them alike; medians over the rounds."""
    token = secrets.token_urlsafe(24)
    servers = [_start(v, certs, token, args.mib) for v in VARIANTS]
    try:
        clients = [_client(loc, *v[1:], certs, token) for v, (_, _, loc) in zip(VARIANTS, servers)]
        for v, client in zip(VARIANTS, clients):  # warm-up
            for _ in range(100):
                list(client.do_action(fl.Action("ping" if v[3] else "x", b"{}")))
            client.do_get(fl.Ticket(b"all")).read_all()
        results = [[] for _ in VARIANTS]
        for r in range(args.repeats):
            benchlib.log(f"round {r + 1}/{args.repeats}")
            for i, (v, client) in enumerate(zip(VARIANTS, clients)):
                results[i].append(_round(v, servers[i][2], client, certs, token, args.calls // args.repeats))
        for client in clients:
            client.close()
    finally:
        for proc, pipe, _ in servers:
            pipe.send("done")
            proc.join(10)
    rows = []
    for v, rounds in zip(VARIANTS, results):
        latencies = sorted(x for r in rounds for x in r["latencies"])
        rows.append({"name": v[0], "first_ms": statistics.median(r["first"] for r in rounds) * 1e3,
                     "p50_us": latencies[len(latencies) // 2] * 1e6,
                     "p90_us": latencies[int(len(latencies) * 0.9)] * 1e6,
                     "mib_s": statistics.median(r["rate"] for r in rounds)})
    return rows


def hmac_costs(n: int = 20000) -> tuple[float, float]:
    security = Security(secrets.token_urlsafe(32))
    started = time.perf_counter()
    for i in range(n):
        ticket = security.sign_ticket("batch", i, 3)
    sign = (time.perf_counter() - started) / n
    started = time.perf_counter()
    for _ in range(n):
        security.verify_ticket(ticket)
    verify = (time.perf_counter() - started) / n
    return sign * 1e6, verify * 1e6


def main() -> None:
    p = benchlib.argument_parser(__doc__)
    p.add_argument("--calls", type=int, default=4000, help="timed do_action calls per variant (default 4000)")
    p.add_argument("--mib", type=int, default=256, help="MiB per do_get stream (default 256)")
    p.add_argument("--repeats", type=int, default=9, help="rounds over the variants: a fresh connection, "
                   "calls/repeats do_action calls and one do_get stream each (default 9)")
    args = p.parse_args()
    benchlib.print_header()
    with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp:
        certs = {k: str(v) for k, v in make_certs(Path(tmp)).items()}
        rows = measure_all(certs, args)
    base = rows[0]
    print(f"\n{args.repeats} rounds over the variants (servers up at once, one process each); per variant "
          f"{args.calls} tiny do_action calls; do_get of {args.mib} MiB in 4 MiB batches and connect + first "
          f"call: medians of the rounds\n")
    print("| variant | connect + first call (ms) | do_action p50 (µs) | p90 (µs) | per call vs plaintext (µs) "
          "| do_get MiB/s | vs plaintext |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['name']} | {r['first_ms']:.2f} | {r['p50_us']:.0f} | {r['p90_us']:.0f} | "
              f"{r['p50_us'] - base['p50_us']:+.0f} | {r['mib_s']:,.0f} | {r['mib_s'] / base['mib_s']:.2f} |")
    sign, verify = hmac_costs()
    print(f"\nticket HMAC-SHA256 (sign_ticket / verify_ticket, incl. building the ticket): "
          f"sign {sign:.1f} µs, verify {verify:.1f} µs")


if __name__ == "__main__":
    main()
