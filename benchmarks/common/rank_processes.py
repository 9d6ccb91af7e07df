"""One process per rank for the benchmarks: what a rank received (``Tally``), a side's result, and
``run_ranks``: spawn the ranks, warm them up, start the timed phase together, sample PSS and CPU."""
from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from dataclasses import dataclass, field

import psutil

from benchmarks.common.benchlib import PssSampler, log

TRAINER_SIDE = "flight_overlord"  # run_ranks' side name for flight_overlord's trainer processes


def load_the_client_first_in_trainers() -> None:
    """In a flight_overlord trainer process, pick Arrow's allocator before the harness loads pyarrow.

    A spawned rank process imports the driver's module again, and with it the harness (pyarrow),
    before its target runs; a training script that wants the system allocator for Flight's reads calls
    ``allocator.system_pool_if_first_to_load_pyarrow`` first thing, before torch and the client (the
    client leaves the process's pool alone). This does it in the benchmarks' trainer processes; the
    other sides' rank processes (process names of other sides) and the driver are left as they are.
    Runs when this module is imported, which the benchmarks that spawn trainer ranks do before
    anything loads pyarrow."""
    if mp.current_process().name.startswith(f"{TRAINER_SIDE}-rank"):
        from flight_overlord import allocator
        allocator.system_pool_if_first_to_load_pyarrow()


load_the_client_first_in_trainers()


# ---------------------------------------------------------------------------------------------
# What a rank received
# ---------------------------------------------------------------------------------------------

def microbatch_nbytes(mb: dict) -> int:
    """What the microbatch's row adds to the Arrow ``nbytes`` of a step table (schemas/microbatch.json).

    Fixed columns 8+4+4+4+4 bytes; each of the ten list columns one 4-byte offset plus its values
    (int32, or one byte for loss_mask and pixel_values); the key strings one offset each plus their
    UTF-8 bytes. Checked against real tables below.
    """
    keys = mb["sample_keys"]
    int32 = sum(mb[k].numel() for k in ("input_ids", "position_ids", "labels", "cu_seqlens", "cu_seqlens_padded",
                                     "image_grid_thw"))
    bytes8 = mb["loss_mask"].numel() + (mb["pixel_values"].numel() if mb["pixel_values"] is not None else 0)
    return 24 + 40 + 4 * (int32 + len(mb["token_ranges"]) + len(keys)) + bytes8 + sum(len(k.encode()) for k in keys)


@dataclass
class Tally:
    """What one rank received in its timed phase."""
    rank: int
    t0: float = 0.0
    t1: float = 0.0
    steps: int = 0
    batches: int = 0
    bytes: int = 0
    samples: int = 0
    tokens: int = 0

    def add_step(self, microbatches: list[dict], nbytes: int) -> None:
        self.steps += 1
        self.batches += len(microbatches)
        self.bytes += nbytes
        for mb in microbatches:
            self.samples += len(mb["sample_keys"])
            self.tokens += int(mb["num_tokens"])


@dataclass
class SideResult:
    side: str
    tallies: list[Tally]
    pss: int
    processes: int
    pss_samples: int
    context_length: int
    notes: list[str] = field(default_factory=list)

    @property
    def elapsed(self) -> float:
        return max(t.t1 for t in self.tallies) - min(t.t0 for t in self.tallies)

    def total(self, name: str) -> int:
        return sum(getattr(t, name) for t in self.tallies)

    @property
    def bytes_per_s(self) -> float:
        return self.total("bytes") / self.elapsed

    @property
    def batches_per_s(self) -> float:
        return self.total("batches") / self.elapsed


# ---------------------------------------------------------------------------------------------
# Running one process per rank: warm-up, then all ranks start the timed phase together
# ---------------------------------------------------------------------------------------------

class RankChannel:
    """The child's side of the protocol: ``warm()`` after warm-up (blocks until all are warm),
    ``result()`` after the timed phase (blocks until the driver has taken its last PSS sample)."""

    def __init__(self, rank: int, messages, go, done):
        self.rank, self.messages, self.go, self.done = rank, messages, go, done

    def warm(self) -> None:
        self.messages.put(("warm", self.rank, None))
        self.go.wait()

    def result(self, tally: Tally) -> None:
        self.messages.put(("result", self.rank, tally))
        self.done.wait(120)


def _rank_main(target, rank: int, messages, go, done, args: tuple) -> None:
    """Entry point of every rank process: run ``target``, report a failure instead of hanging the driver."""
    try:
        target(RankChannel(rank, messages, go, done), *args)
    except BaseException:
        messages.put(("error", rank, traceback.format_exc()))
        raise


def run_ranks(side: str, target, rank_args: list[tuple], *, label: str, child_label: str = "child",
              extra_roots=lambda: [], timeout: float) -> tuple[list[Tally], PssSampler]:
    """Start one spawned process per rank running ``target(channel, *args)``; return their tallies and
    the PSS sampler (over the rank processes, their children and ``extra_roots()``: (pid, label, child label))."""
    ctx = mp.get_context("spawn")
    messages, go, done = ctx.Queue(), ctx.Event(), ctx.Event()
    procs = [ctx.Process(target=_rank_main, args=(target, rank, messages, go, done, args),
                         name=f"{side}-rank{rank}")  # not daemonic: DataLoader workers are children
             for rank, args in enumerate(rank_args)]
    sampler = PssSampler(lambda: [(p.pid, label, child_label) for p in procs if p.pid is not None]
                         + list(extra_roots()))
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        _collect(messages, procs, "warm", deadline)
        log(f"[{side}] warm-up done, timing")
        sampler.start()
        go.set()
        results = _collect(messages, procs, "result", deadline)
        sampler.stop()
        done.set()
        for p in procs:
            p.join(30)
        return [results[r] for r in range(len(procs))], sampler
    finally:
        done.set()
        go.set()
        stop_processes(procs)


def _collect(messages, procs, kind: str, deadline: float) -> dict:
    got = {}
    while len(got) < len(procs):
        try:
            what, rank, payload = messages.get(timeout=0.5)
        except queue.Empty:
            for p in procs:
                if p.exitcode is not None and procs.index(p) not in got:
                    raise RuntimeError(f"{p.name} exited with code {p.exitcode} before sending {kind!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {kind!r} from ranks {sorted(set(range(len(procs))) - set(got))}")
            continue
        if what == "error":
            raise RuntimeError(f"rank {rank} failed:\n{payload}")
        if what == kind:
            got[rank] = payload
    return got


def stop_processes(procs) -> None:
    """Terminate ``procs`` (multiprocessing or subprocess objects, or pids) and all their descendants."""
    tree: list[psutil.Process] = []
    for p in procs:
        pid = p if isinstance(p, int) else p.pid
        if pid is None:
            continue
        try:
            root = psutil.Process(pid)
            tree += root.children(recursive=True) + [root]
        except psutil.NoSuchProcess:
            continue
    for proc in tree:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=5)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    for p in procs:
        if hasattr(p, "join"):
            p.join(1)
