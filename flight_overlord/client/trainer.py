"""The trainer side: a plain Flight client that yields each step's microbatches as torch tensors.

    client = TrainerClient("grpc://127.0.0.1:8815", rank=0)
    for step_batch in client:            # one list per step, one dict per microbatch
        for mb in step_batch:
            loss = model(mb["input_ids"], position_ids=mb["position_ids"], cu_seqlens=mb["cu_seqlens"])

``state_dict()`` / ``load_state_dict()`` hold the next step, so a restarted trainer
resumes where it stopped.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from typing import TYPE_CHECKING, Iterator

import pyarrow as pa

from .. import allocator, wire
from ..wire.actions import PositionRequest, Report
from ..wire.credits import HEARTBEAT_SECONDS, credit_after
from ..wire.security import Credentials
from .fetcher import StepFetcher
from .launcher import PLANNER_ENV, launcher_rank
from .tensors import TensorPlacement, table_to_encoder_inputs, table_to_microbatches

if TYPE_CHECKING:
    import torch


def in_step(rank: int, batches: Iterator[tuple[int, pa.Table]],
            encoders: Iterator[tuple[int, pa.Table]]) -> Iterator[tuple[int, pa.Table, pa.Table]]:
    """(step, batch table, encoder table): a rank's two streams read in step. A stream that ends
    before the other, or sends another step, is an error naming the rank and the step: never a silent
    end of iteration (a ``StopIteration`` handed to the consumer would be one)."""
    for step, table in batches:
        encoder = next(encoders, None)
        if encoder is None:
            raise RuntimeError(f"rank {rank}: the encoder stream ended before step {step}; the batch stream goes on")
        if encoder[0] != step:
            raise RuntimeError(f"rank {rank}: encoder stream at step {encoder[0]}, batches at {step}")
        yield step, table, encoder[1]
    extra = next(encoders, None)
    if extra is not None:
        raise RuntimeError(f"rank {rank}: the batch stream ended before step {extra[0]}; the encoder stream goes on")


class TrainerClient:
    """Iterates steps from ``start_step`` on, prefetching ``prefetch`` steps in a background thread.

    The client is its own iterator, like a file: one prefetch thread serves it for its whole life,
    so a second ``for`` loop (an epoch loop, a framework wrapper calling ``iter()`` again) continues
    where the last one stopped, in order, no step twice. ``state_dict()`` names the step after the
    last one yielded, at any point between steps. ``close()`` stops the thread and joins it."""

    CLOSE_JOIN_SECONDS = 10.0  # close() waits this long for a fetch in flight (the thread is a daemon)

    def __init__(self, planner: str, rank: int, *, start_step: int = 0, num_steps: int | None = None,
                 prefetch: int = 2, timeout: float = 300.0, as_tensors: bool = True, encoder: bool = False,
                 token: str | None = None, credentials: Credentials | None = None,
                 device: "str | torch.device | None" = None, pin_memory: bool = False,
                 system_allocator: bool = False):
        """``num_steps``: how many steps to yield in all, counted from the step of the first
        iteration (None: no end). ``encoder=True`` (strategies with an image graph): each step yields
        ``(microbatches, encoder_inputs)``, the second being the images this rank's vision encoder
        processes. ``token`` / ``credentials``: as for :class:`StepFetcher` (trainer token, TLS).
        ``pin_memory``: tensors are copied to page-locked memory (needs an accelerator), so that
        ``device`` (say ``"cuda:0"``) receives them asynchronously; ``device``: where the tensors
        are placed (default: left on the CPU as zero-copy views of the Arrow buffers).
        ``system_allocator=True``: the host process's default Arrow memory pool, which every pyarrow
        call of the process allocates from, becomes the system allocator (mimalloc keeps ~4 MiB of freed
        pages per trainer; ``$ARROW_DEFAULT_MEMORY_POOL``, where set, wins). That is process-wide state,
        so the client changes it only when asked: by default it leaves the pool as the process chose it.
        Flight's own reads use the pool Arrow picked as pyarrow loaded: to have them on the system
        allocator too, call ``flight_overlord.allocator.system_pool_if_first_to_load_pyarrow()`` first
        thing in the training script (before anything loads pyarrow), or set the variable."""
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch!r}")
        if system_allocator:
            allocator.use_system_pool()
        self._placement = TensorPlacement(device, pin_memory) if (device is not None or pin_memory) else None
        self.rank = rank
        self.encoder = encoder
        self.next_step = start_step
        self.num_steps = num_steps
        self.prefetch = prefetch
        self.as_tensors = as_tensors
        # rank streams with credits: at most prefetch + 1 steps sent and not yet yielded (wire/credits.py)
        options = {"timeout": timeout, "token": token, "credentials": credentials, "window": prefetch + 1}
        self._fetcher = StepFetcher(planner, rank, **options)
        # the encoder inputs come on a second rank stream, read in step with the first
        self._encoder_fetcher = StepFetcher(planner, rank, **options) if encoder else None
        self._queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._end: int | None = None
        self._failure: BaseException | None = None
        self._waits: dict[int, dict[str, float]] = {}  # step -> its ticket, fetch and starved seconds
        self._waits_lock = threading.Lock()  # the prefetch thread and the training loop both write

    def report(self, step: int, losses: dict[str, float] | float | None = None,
               compute_seconds: float | list[float] | None = None, encoder_seconds: float | None = None) -> None:
        """Feedback on ``step``: per-source training loss, for dynamic mixing schedules (``dynamic(...)``),
        or one number, the overall loss (shown by ``overlord status``, under ``trainer_losses``),
        and/or this rank's measured compute seconds (one number, or one per microbatch: see
        :class:`~.compute_timer.ComputeTimer`), from which ``cost: {fit: true}`` fits the cost model.
        ``encoder_seconds``: the vision encoder's seconds on this rank's images (image graph), for
        ``cost.fit_encoder``. The step's data waits this client measured go along (``overlord status``
        attributes them)."""
        with self._waits_lock:
            waits = self._waits.pop(step, None)
        if compute_seconds is not None:
            compute_seconds = ([float(s) for s in compute_seconds] if isinstance(compute_seconds, (list, tuple))
                               else float(compute_seconds))
        overall = None
        if isinstance(losses, (int, float)) and not isinstance(losses, bool):
            losses, overall = None, float(losses)
        body = Report(step, self.rank, losses, compute_seconds,
                      None if encoder_seconds is None else float(encoder_seconds), waits, overall).to_wire()
        fetcher = self._fetcher
        fetcher.retry(lambda client: wire.call(client, "report", body),
                      fetcher.planner_location, f"report of step {step}", "the planner")

    def state_dict(self) -> dict:
        """The position: the step after the last one yielded (prefetched steps are not counted)."""
        return {"rank": self.rank, "next_step": self.next_step}

    def load_state_dict(self, state: dict) -> None:
        self._check_not_iterating("load_state_dict")
        self.next_step = int(state["next_step"])

    def rejoin(self) -> int:
        """Take this rank's position from the Planner, for a rank (or a whole replica group) restarted
        without its state, as torchft heals one: the earliest step any rank of its data-parallel index
        waits for (``TrainerPositions.rejoin_step``). Call it before iterating, instead of
        ``load_state_dict``; returns the step the client now starts at."""
        self._check_not_iterating("rejoin")
        fetcher = self._fetcher
        answer = fetcher.retry(lambda client: wire.call(client, "position", PositionRequest(self.rank).to_wire()),
                               fetcher.planner_location, "position", "the planner")
        self.next_step = int(answer["step"])
        return self.next_step

    def _check_not_iterating(self, what: str) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{what} must be called before iterating (rank {self.rank} is at step "
                               f"{self.next_step}): make a new TrainerClient to start elsewhere")

    def __iter__(self) -> "TrainerClient":
        return self

    def __next__(self):
        if self._stop.is_set():
            raise RuntimeError(f"TrainerClient of rank {self.rank} is closed")
        if self._thread is None:
            self._start_prefetch()
        if self._failure is not None:
            raise self._failure
        if self._end is not None and self.next_step >= self._end:
            raise StopIteration
        idle = time.monotonic()
        item = self._next_item()
        if isinstance(item, BaseException):
            self._failure = item  # the thread has stopped: every later call says why
            raise item
        step, table, encoder = item
        self._waited(step, "starved", time.monotonic() - idle)
        self.next_step = step + 1
        if not self.as_tensors:
            return (table, encoder) if self.encoder else table
        batch = self._place(table_to_microbatches(table))
        return (batch, self._place(table_to_encoder_inputs(encoder))) if self.encoder else batch

    def _next_item(self):
        """The next prefetched item; a wait that lasts is logged (what, where, since when)."""
        since = time.time()
        while True:
            try:
                return self._queue.get(timeout=HEARTBEAT_SECONDS)
            except queue.Empty:
                self._fetcher.waiting(f"step {self.next_step}", since)

    def _place(self, rows: list[dict]) -> list[dict]:
        return rows if self._placement is None else [self._placement(row) for row in rows]

    @classmethod
    def from_env(cls, planner: str | None = None, *, env: dict | None = None, **options) -> "TrainerClient":
        """The client of this process's rank, from the launcher's environment (:func:`launcher_rank`:
        torchrun, Slurm, Open MPI) and the Planner's address (``planner``, else ``$OVERLORD_PLANNER``).
        The launcher's world size must be the run's mesh (asked of the Planner, waiting for it up to
        ``timeout``): a mismatch is an error naming both. ``options``: as for the constructor."""
        env = os.environ if env is None else env
        rank, world_size = launcher_rank(env)
        planner = planner or env.get(PLANNER_ENV)
        if not planner:
            raise ValueError(f"no Planner address: pass it, or set ${PLANNER_ENV} (the grpc://HOST:PORT "
                             f"`overlord up` prints)")
        client = cls(planner, rank, **options)
        try:
            client.check_world_size(world_size)
        except BaseException:
            client.close()
            raise
        return client

    def check_world_size(self, world_size: int) -> None:
        """Raise when ``world_size`` (the launcher's) is not the number of ranks of the run's mesh."""
        fetcher = self._fetcher
        status = fetcher.retry(lambda client: wire.call(client, "status", {}), fetcher.planner_location,
                               "status", "the planner")
        if status["world_size"] != world_size:
            raise ValueError(f"the launcher started {world_size} ranks but the run at {fetcher.planner_location} "
                             f"has a mesh of {status['world_size']} ranks (pp x dp x cp x tp of its config): "
                             f"launch {status['world_size']} processes, or change the config's mesh")

    def _start_prefetch(self) -> None:
        self._end = None if self.num_steps is None else self.next_step + self.num_steps
        self._thread = threading.Thread(target=self._prefetch_loop, args=(self.next_step, self._end),
                                        name=f"overlord-prefetch-rank{self.rank}", daemon=True)
        self._thread.start()

    def _prefetch_loop(self, step: int, end: int | None) -> None:
        try:
            batches = self._fetcher.stream(step, end)
            items = (in_step(self.rank, batches, self._encoder_fetcher.stream(step, end, "encoder-rank"))
                     if self.encoder else ((s, table, None) for s, table in batches))
            for item in items:
                self._put(item)
                self._credit(credit_after(item[0], self.prefetch, self._queue.qsize()))
                step = item[0] + 1
                if self._stop.is_set():
                    return
            if end is None or step < end:  # the consumer would wait for a step that never comes
                raise RuntimeError(f"rank {self.rank}: the rank stream ended at step {step}"
                                   + ("" if end is None else f", before step {end}"))
        except BaseException as exc:  # hand the failure to the consumer instead of dying silently
            if not self._stop.is_set():
                self._put(exc)

    def _waited(self, step: int, name: str, seconds: float) -> None:
        with self._waits_lock:
            self._waits.setdefault(step, {})[name] = seconds
            for old in [s for s in self._waits if s < step - 64]:  # steps nobody reported
                del self._waits[old]

    def _put(self, item) -> None:
        """Queue ``item`` once there is room; meanwhile the streams hear the credit again now and then, so
        that a constructor's handler waiting for it notices its server stopping (``wire/credits.py``)."""
        waited = time.monotonic()
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                if time.monotonic() - waited >= HEARTBEAT_SECONDS:
                    waited = time.monotonic()
                    self._credit(None)

    def _credit(self, upto: int | None) -> None:
        for fetcher in (self._fetcher, self._encoder_fetcher):
            if fetcher is not None:
                fetcher.credit(upto)

    def close(self) -> None:
        """Stop the prefetch thread and join it; the client yields nothing more."""
        self._stop.set()
        self._fetcher.close()  # a fetch in flight ends at its next retry
        if self._encoder_fetcher is not None:
            self._encoder_fetcher.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.CLOSE_JOIN_SECONDS)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
