"""Drive every rank of a running system and digest what each got: the one place the tests, the
benchmarks and ``scripts/stream_digest.py`` do it.

- :func:`each_rank`: ``fn(rank)`` for every rank at once, one thread each, as trainers run; the first
  error of any rank is raised in the caller.
- :func:`train`: every rank through a :class:`~flight_overlord.client.TrainerClient` over steps
  ``[start, end)``, what ``on_table`` makes of each table kept per rank.
- :func:`fetch_steps`: :func:`train` keeping each table; :func:`stock_fetch`: one ``(step, rank)`` as a
  stock ``pyarrow.flight`` client reads it (the per-step descriptor, a contract).
- Digests: :func:`step_digest` (a step's sample keys and token ids), :func:`table_digest` (every
  column), :func:`plan_hash` (the journaled plans as the journal serves them again: what each serves).
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.flight as fl

from . import wire
from .wire.server import ask_again, connect

PLAN_WAIT_SECONDS = 600.0  # a stock client's get_flight_info times out server-side while a step is planned


def blake(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def step_digest(table: pa.Table) -> tuple:
    """One step of one rank: its sample keys per microbatch and a hash of every token id it holds."""
    ids = table.column("input_ids").combine_chunks()
    return (tuple(tuple(k) for k in table.column("sample_keys").to_pylist()),
            hashlib.blake2b(ids.values.to_numpy().tobytes(), digest_size=8).hexdigest())


def table_digest(table: pa.Table) -> str:
    """Every column's values, in schema order (chunking and buffer layout do not count)."""
    h = hashlib.blake2b(digest_size=12)
    for name in table.column_names:
        h.update(name.encode())
        h.update(json.dumps(table.column(name).to_pylist(), sort_keys=True, default=str).encode())
    return h.hexdigest()


PLAN_FIELDS = ("step", "layout", "weights", "feedback", "bins", "samples", "encoder")  # what a plan serves
REPEAT_FIELDS = ("epochs", "encoder_epochs")  # each place's epoch: only in the plans that met a row twice


def plan_hash(run_dir: Path, steps: int, *, root: Path | None = None) -> str:
    """The plans of steps < ``steps`` as the run's journal serves them again (re-derived from the
    source files, each checked against its journaled digest): ``hash_plans`` of them."""
    from .planner.audit import plan_records
    return hash_plans(plan_records(Path(run_dir)), steps, root=root)


def hash_plans(records: list[dict], steps: int, *, root: Path | None = None) -> str:
    """The plans of steps < ``steps`` in step order (a step planned again after a rewind: its last
    record), the fields a plan serves (``PLAN_FIELDS``; wall-clock fields, state and stats do not
    count); ``root``, a folder the config lives in, is left out of every path."""
    plans = {}
    for record in records:
        if "bins" in record and record.get("step", steps) < steps:
            plans[record["step"]] = {k: record.get(k) for k in PLAN_FIELDS}
            plans[record["step"]].update((k, record[k]) for k in REPEAT_FIELDS if k in record)
    if sorted(plans) != list(range(steps)):
        raise ValueError(f"the plan journal holds plans of steps {sorted(plans)}, not 0..{steps - 1}")
    text = json.dumps([plans[s] for s in range(steps)], sort_keys=True)
    return blake((text.replace(json.dumps(str(root))[1:-1], "") if root is not None else text).encode())


class RankThreads:
    """``fn(rank)`` for every rank at once, a thread each, started at once; ``errors`` holds what any
    rank raised (``rank N: Type: message``), for a driver that measures while the ranks run."""

    def __init__(self, fn: Callable[[int], None], ranks: int, *, daemon: bool = True):
        self.errors: list[str] = []
        self._raised: list[BaseException] = []
        self._fn = fn
        self._threads = [threading.Thread(target=self._run, args=(r,), name=f"rank-{r}", daemon=daemon)
                         for r in range(ranks)]
        for t in self._threads:
            t.start()

    def _run(self, rank: int) -> None:
        try:
            self._fn(rank)
        except BaseException as exc:  # noqa: BLE001 - kept for the driver (join raises the first)
            self._raised.append(exc)
            self.errors.append(f"rank {rank}: {type(exc).__name__}: {exc}")

    def join(self, timeout: float | None = 300, *, raise_error: bool = True) -> None:
        """Wait for every rank (``timeout`` each); the first rank's error is raised here."""
        for t in self._threads:
            t.join(timeout=timeout)
        if raise_error and self._raised:
            raise self._raised[0]


def each_rank(fn: Callable[[int], None], ranks: int, *, timeout: float | None = 300, daemon: bool = False) -> None:
    """``fn(rank)`` for every rank at once, a thread each; the first rank's error is raised here."""
    RankThreads(fn, ranks, daemon=daemon).join(timeout)


def train(planner: str, ranks: int, start: int, end: int, *, on_table: Callable = None,
          **client_options) -> dict[int, list]:
    """Every rank through a TrainerClient (retries, prefetch) from step ``start`` to ``end``; per rank, the
    list of ``on_table(rank, client, table)`` (default: ``(step, step_digest(table))``)."""
    from .client import TrainerClient
    on_table = on_table or (lambda rank, client, table: (table.column("step")[0].as_py(), step_digest(table)))
    client_options = {"as_tensors": False, "timeout": 120, **client_options}
    streams: dict[int, list] = {r: [] for r in range(ranks)}

    def rank_loop(rank: int) -> None:
        with TrainerClient(planner, rank, num_steps=end - start, **client_options) as client:
            client.load_state_dict({"rank": rank, "next_step": start})
            for table in client:
                streams[rank].append(on_table(rank, client, table))

    each_rank(rank_loop, ranks)
    return streams


def fetch_steps(planner: str, ranks: int, start: int, end: int, *, timeout: float = 120,
                keep: bool = True, credentials=None) -> dict[int, list[pa.Table | None]]:
    """Steps ``[start, end)`` of every rank as :func:`train` reads them, the tables kept (``keep=False``: a
    None per step, a drive to a step)."""
    return train(planner, ranks, start, end, on_table=lambda rank, client, table: table if keep else None,
                 timeout=timeout, credentials=credentials)


def stock_fetch(client_of: Callable[[str], fl.FlightClient], planner: str, step: int, rank: int) -> pa.Table:
    """One ``(step, rank)`` as a stock Flight client reads it: the Planner's FlightInfo, then every
    endpoint's ticket where it says (a server-side wait that times out is asked again)."""
    descriptor = fl.FlightDescriptor.for_path("batch", str(step), str(rank))
    info = ask_again(lambda: client_of(planner).get_flight_info(descriptor),
                     deadline=time.monotonic() + PLAN_WAIT_SECONDS)
    tables = []
    for endpoint in info.endpoints:
        location = endpoint.locations[0].uri.decode() if endpoint.locations else planner
        tables.append(client_of(location).do_get(endpoint.ticket).read_all())
    return pa.concat_tables(tables)


def served_step(cluster, rank: int) -> int:
    """The last step ``rank``'s constructor handed to its stream (-1: none yet), from the roles' status."""
    planner = connect(cluster.planner, cluster.credentials)
    try:
        constructors = wire.call(planner, "status")["constructors"]
    finally:
        planner.close()
    for location in constructors.values():
        client = connect(location, cluster.credentials)
        try:
            served = wire.call(client, "status")["served"]
        finally:
            client.close()
        if str(rank) in served:
            return served[str(rank)]["step"]
    return -1
