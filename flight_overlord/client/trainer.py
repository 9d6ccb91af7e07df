"""The trainer side: a plain Flight client that yields each step's microbatches as torch tensors.

    client = TrainerClient("grpc://127.0.0.1:8815", rank=0)
    for step_batch in client:            # one list per step, one dict per microbatch
        for mb in step_batch:
            loss = model(mb["input_ids"], position_ids=mb["position_ids"], cu_seqlens=mb["cu_seqlens"])

``state_dict()`` / ``load_state_dict()`` hold the next step, so a restarted trainer
resumes where it stopped.
"""
from __future__ import annotations

import queue
import threading
import time
import warnings
from typing import Iterator

import pyarrow as pa
import pyarrow.flight as fl

from .. import wire
from ..wire.security import Credentials
from ..wire.server import RETRY_SECONDS, ClientPool


def _rows(table: pa.Table, name: str) -> list["torch.Tensor"]:
    """A list column as one torch tensor per row: zero-copy views of the Arrow values buffer."""
    import torch
    column = table.column(name).combine_chunks()
    offsets = column.offsets.to_numpy()
    with warnings.catch_warnings():  # Arrow buffers are read-only; torch only warns about that
        warnings.simplefilter("ignore", UserWarning)
        values = torch.from_numpy(column.values.to_numpy(zero_copy_only=False))
    return [values[offsets[i]:offsets[i + 1]] for i in range(len(column))]


def table_to_microbatches(table: pa.Table) -> list[dict]:
    """Arrow microbatch rows -> dicts of torch tensors (token and pixel tensors are zero-copy views).

    ``input_ids`` (and ``position_ids``, ``labels``, ``loss_mask``) hold the positions
    ``token_ranges`` names: the whole sequence, this rank's context-parallel share, or nothing
    (metadata only: they are None; ``cu_seqlens`` and the keys are still there for pipeline
    stages and broadcast receivers). Under THD context parallelism ``cu_seqlens`` and
    ``cu_seqlens_padded`` may end with a padding-only sequence (zero real tokens: the buffer's tail
    padding), one more than ``sample_keys``, as TransformerEngine takes them. Image-text rows add ``pixel_values`` uint8 [patches, 3*p*p]
    and ``image_grid_thw`` int32 [images, 3]. Under distribute('HDP'): :func:`hdp_microbatches`."""
    import torch

    if (table.schema.metadata or {}).get(b"name") == b"hdp_microbatch":
        return hdp_microbatches(table)

    tensors = {name: _rows(table, name) for name in ("input_ids", "position_ids", "labels", "loss_mask",
                                                     "pixel_values", "image_grid_thw")}
    lists = {name: table.column(name).to_pylist()
             for name in ("step", "bucket", "token_ranges", "sequence_length", "cu_seqlens", "cu_seqlens_padded", "sample_keys",
                          "num_tokens")}
    out = []
    for i in range(table.num_rows):
        has_tokens = len(lists["token_ranges"][i]) > 0
        grid = tensors["image_grid_thw"][i].view(-1, 3)
        pixels = tensors["pixel_values"][i]
        patches = int(grid.prod(dim=1).sum()) if len(grid) else 0
        mb = {name: lists[name][i] for name in lists}
        mb.update({name: tensors[name][i] if has_tokens else None
                   for name in ("input_ids", "position_ids", "labels", "loss_mask")})
        mb["microbatch"] = i
        mb["cu_seqlens"] = torch.tensor(lists["cu_seqlens"][i], dtype=torch.int32)
        mb["cu_seqlens_padded"] = torch.tensor(lists["cu_seqlens_padded"][i], dtype=torch.int32)
        mb["image_grid_thw"] = grid
        mb["pixel_values"] = pixels.view(patches, -1) if patches and len(pixels) else None
        out.append(mb)
    return out


def hdp_microbatches(table: pa.Table) -> list[dict]:
    """``schemas/hdp_microbatch.json`` rows -> dicts: token tensors (zero-copy; None for metadata only)
    and, per sequence, its CP group (``seq_cp_size``, ``seq_cp_rank``, ``seq_cp_first``: the domain
    ranks [first, first + size) to form or pick a process group from), its THD chunks
    (``token_ranges``), the whole sequences' ``cu_seqlens`` / ``cu_seqlens_padded`` and where each
    share sits in ``input_ids`` (``cu_local``)."""
    import torch

    names = ("input_ids", "position_ids", "labels", "loss_mask")
    tensors = {name: _rows(table, name) for name in names}
    lists = {name: table.column(name).to_pylist() for name in table.column_names if name not in names}
    out = []
    for i in range(table.num_rows):
        mb = {name: lists[name][i] for name in lists}
        has_tokens = len(lists["token_ranges"][i]) > 0
        mb.update({name: tensors[name][i] if has_tokens else None for name in names})
        for name in ("cu_seqlens", "cu_seqlens_padded", "cu_local"):
            mb[name] = torch.tensor(lists[name][i], dtype=torch.int32)
        out.append(mb)
    return out


def table_to_encoder_inputs(table: pa.Table) -> list[dict]:
    """Encoder rows (one per image) -> dicts: ``pixel_values`` uint8 [patches, 3*p*p] (zero-copy) and
    ``image_grid_thw`` int32 [1, 3], with the owner to send the embeddings back to."""
    pixels, grids = _rows(table, "pixel_values"), _rows(table, "image_grid_thw")
    keys, images, buckets, mbs = (table.column(c).to_pylist()
                                  for c in ("sample_key", "image_index", "owner_bucket", "owner_microbatch"))
    out = []
    for i in range(table.num_rows):
        grid = grids[i].view(-1, 3)
        out.append({"sample_key": keys[i], "image_index": images[i], "owner_bucket": buckets[i],
                    "owner_microbatch": mbs[i],
                    "image_grid_thw": grid, "pixel_values": pixels[i].view(int(grid.prod(dim=1).sum()), -1)})
    return out


def _batches(reader: fl.FlightStreamReader) -> Iterator[pa.RecordBatch]:
    while True:
        try:
            yield reader.read_chunk().data
        except StopIteration:
            return


class StepFetcher:
    """Fetches one rank's raw Arrow tables step by step: Planner ticket, then the constructor's do_get.

    ``token``: a trainer token (default ``$OVERLORD_TRAINER_TOKEN``), needed when the run's config
    names trainer tokens; ``credentials`` (``wire.security.Credentials``): token and TLS material at
    once (default: the token, and the CA / client certificate files of ``$OVERLORD_TLS_CA``,
    ``$OVERLORD_TLS_CERT``, ``$OVERLORD_TLS_KEY``)."""

    def __init__(self, planner: str, rank: int, *, timeout: float = 300.0, token: str | None = None,
                 credentials: Credentials | None = None):
        self.rank = rank
        self.timeout = timeout
        if credentials is None:
            credentials = Credentials.for_trainer(token)
        elif token is not None:
            credentials = credentials.with_token(token)
        self._pool = ClientPool(credentials)
        self.planner_location = planner

    @property
    def planner(self) -> fl.FlightClient:
        """A client of the Planner (for calls of your own: it carries the credentials)."""
        return self._pool.get(self.planner_location)

    def fetch(self, step: int, kind: str = "batch") -> pa.Table:
        """``kind`` "batch": the rank's microbatches; "encoder": the images its vision encoder
        processes (only when the strategy has an image graph)."""
        descriptor = fl.FlightDescriptor.for_path(kind, str(step), str(self.rank))
        info = self.retry(lambda client: client.get_flight_info(descriptor), self.planner_location,
                          f"ticket of step {step}", "the planner")
        tables = []
        for endpoint in info.endpoints:
            # pyarrow does not follow endpoint locations: redeem the ticket where the Planner says.
            location = endpoint.locations[0].uri.decode() if endpoint.locations else self.planner_location
            tables.append(self.retry(lambda client: client.do_get(endpoint.ticket).read_all(), location,
                                     f"data of step {step}", "the constructor"))
        return pa.concat_tables(tables)

    def stream(self, step: int, end: int | None = None) -> Iterator[tuple[int, pa.Table]]:
        """(step, table) from ``step`` on (up to ``end``) over the rank stream: one ticket from the Planner,
        one long-lived ``do_get`` at the constructor. When the stream breaks (the constructor died or
        moved) the Planner is asked again for where to resume, at the next step not yet received, so no
        step comes twice or is skipped; after ``timeout`` of failures the error names the constructor."""
        down_since = None
        while end is None or step < end:
            descriptor = fl.FlightDescriptor.for_path("rank", str(self.rank), str(step))
            info = self.retry(lambda client: client.get_flight_info(descriptor), self.planner_location,
                              f"rank ticket from step {step}", "the planner")
            endpoint = info.endpoints[0]
            location = endpoint.locations[0].uri.decode() if endpoint.locations else self.planner_location
            reader = None
            try:
                reader = self._pool.get(location).do_get(endpoint.ticket)
                for batch in _batches(reader):
                    down_since = None
                    got = batch.column("step")[0].as_py() if batch.num_rows else step
                    if got != step:
                        raise RuntimeError(f"rank {self.rank}: the rank stream sent step {got}, expected {step}")
                    yield step, pa.Table.from_batches([batch])
                    step += 1
                    if end is not None and step >= end:
                        return
                raise fl.FlightUnavailableError(f"the rank stream at {location} ended (the constructor is stopping)")
            except (fl.FlightUnavailableError, fl.FlightInternalError, fl.FlightCancelledError,
                    fl.FlightTimedOutError) as exc:
                down_since = down_since or time.time()
                self._pool.forget(location)
                if time.time() - down_since > self.timeout:
                    raise TimeoutError(f"rank {self.rank}: the rank stream from the constructor at {location} broke "
                                       f"at step {step} and has not come back since "
                                       f"{time.strftime('%H:%M:%S', time.localtime(down_since))}: {exc}") from None
                time.sleep(RETRY_SECONDS)
            finally:
                if reader is not None:
                    reader.cancel()

    def retry(self, call, location: str, what: str, role: str):
        """``call(client)`` at ``location``. Server-side waits time out and are asked again; an
        unreachable role (restarting) is polled every ``RETRY_SECONDS`` on a fresh connection; after
        ``timeout`` the error says which role is down, where, and since when."""
        deadline = time.monotonic() + self.timeout
        down_since = None
        while True:
            try:
                return call(self._pool.get(location))
            except fl.FlightTimedOutError:  # the server waited its share; the data is still coming
                down_since = None
            except fl.FlightUnavailableError:
                down_since = down_since or time.time()
                self._pool.forget(location)
                time.sleep(RETRY_SECONDS)
            if time.monotonic() > deadline:
                if down_since is not None:
                    raise TimeoutError(f"rank {self.rank}: no {what}: {role} at {location} has been unreachable "
                                       f"since {time.strftime('%H:%M:%S', time.localtime(down_since))}") from None
                raise TimeoutError(f"rank {self.rank}: no {what} after {self.timeout:.0f}s") from None

    def close(self) -> None:
        self._pool.close()


class TrainerClient:
    """Iterates steps from ``start_step`` on, prefetching ``prefetch`` steps in a background thread."""

    def __init__(self, planner: str, rank: int, *, start_step: int = 0, num_steps: int | None = None,
                 prefetch: int = 2, timeout: float = 300.0, as_tensors: bool = True, encoder: bool = False,
                 token: str | None = None, credentials: Credentials | None = None):
        """``encoder=True`` (strategies with an image graph): each step yields ``(microbatches,
        encoder_inputs)``, the second being the images this rank's vision encoder processes.
        ``token`` / ``credentials``: as for :class:`StepFetcher` (trainer token, TLS)."""
        self.rank = rank
        self.encoder = encoder
        self.next_step = start_step
        self.num_steps = num_steps
        self.prefetch = prefetch
        self.as_tensors = as_tensors
        self._fetcher = StepFetcher(planner, rank, timeout=timeout, token=token, credentials=credentials)
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def report(self, step: int, losses: dict[str, float]) -> None:
        """Per-source training loss of ``step``, for dynamic mixing schedules (``dynamic(...)``)."""
        fetcher = self._fetcher
        fetcher.retry(lambda client: wire.call(client, "report", {"step": step, "rank": self.rank, "losses": losses}),
                      fetcher.planner_location, f"report of step {step}", "the planner")

    def state_dict(self) -> dict:
        return {"rank": self.rank, "next_step": self.next_step}

    def load_state_dict(self, state: dict) -> None:
        if self._thread is not None:
            raise RuntimeError("load_state_dict must be called before iterating")
        self.next_step = int(state["next_step"])

    def __iter__(self) -> Iterator:
        end = None if self.num_steps is None else self.next_step + self.num_steps
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._thread = threading.Thread(target=self._prefetch_loop, args=(self.next_step, end), daemon=True)
        self._thread.start()
        while end is None or self.next_step < end:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            step, table, encoder = item
            self.next_step = step + 1
            batch = table_to_microbatches(table) if self.as_tensors else table
            if self.encoder:
                yield batch, table_to_encoder_inputs(encoder) if self.as_tensors else encoder
            else:
                yield batch

    def _prefetch_loop(self, step: int, end: int | None) -> None:
        try:
            if not self.encoder:  # the rank stream (encoder inputs come per step, beside it)
                for step, table in self._fetcher.stream(step, end):
                    self._put((step, table, None))
                    if self._stop.is_set():
                        return
                return
            while not self._stop.is_set() and (end is None or step < end):
                table = self._fetcher.fetch(step)
                encoder = self._fetcher.fetch(step, "encoder") if self.encoder else None
                self._put((step, table, encoder))
                step += 1
        except BaseException as exc:  # hand the failure to the consumer instead of dying silently
            self._put(exc)

    def _put(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        self._stop.set()
        self._fetcher.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
