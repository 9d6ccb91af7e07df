"""Timing a rank's own compute for ``TrainerClient.report(step, compute_seconds=...)`` (``cost.fit``).

    timer = ComputeTimer()
    for mb in step_batch:
        with timer.microbatch():           # forward + backward of one microbatch, nothing else
            loss = model(mb["input_ids"], ...)
            loss.backward()
    optimizer.step()                       # after the timed region: collectives are not the data's cost
    client.report(step, losses, compute_seconds=timer.take())

Measure before collectives: the gradient all-reduce waits for the slowest rank, so timing it would
report the imbalance instead of this rank's cost. Under DDP wrap all but the last microbatch in
``model.no_sync()`` and leave the last one's backward (which all-reduces) out of the timer, or time
forward + backward with gradient sync off and reduce once after. On a GPU the timer synchronizes the
device at both ends of the region, so it measures the kernels, not their launch.
"""
from __future__ import annotations

import time
from contextlib import contextmanager


def _cuda_synchronizer():
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a base dependency
        return None
    return torch.cuda.synchronize if torch.cuda.is_available() and torch.cuda.is_initialized() else None


class ComputeTimer:
    """Seconds per timed microbatch of the current step; ``take()`` returns them and starts the next step.

    ``clock``: a monotonic clock (seconds); ``synchronize``: called at both ends of a region (default:
    ``torch.cuda.synchronize`` once CUDA is in use, else nothing)."""

    def __init__(self, clock=time.perf_counter, synchronize=None):
        self._clock = clock
        self._synchronize = synchronize
        self.seconds: list[float] = []

    @contextmanager
    def microbatch(self):
        sync = self._synchronize or _cuda_synchronizer()
        if sync:
            sync()
        start = self._clock()
        try:
            yield
        finally:
            if sync:
                sync()
            self.seconds.append(self._clock() - start)

    def take(self) -> list[float]:
        """This step's seconds per microbatch (for ``compute_seconds``); the timer starts afresh."""
        seconds, self.seconds = self.seconds, []
        return seconds
