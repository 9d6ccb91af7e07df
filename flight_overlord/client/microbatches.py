"""A rank's stream one microbatch at a time, the way training frameworks pull a loader.

    view = MicrobatchView(TrainerClient(planner, rank), int64=True, batch_dim=True)
    for mb in view:                       # one microbatch per next(): mb["step"], mb["microbatch"]
        loss = model(mb["input_ids"], position_ids=mb["position_ids"])   # [1, S] int64
    view.state_dict()                     # {"rank", "step", "microbatch"}: the next one to yield

The position is exact between any two microbatches: ``load_state_dict`` of a state taken after
microbatch k of step s continues with microbatch k + 1 of step s (the step is read again and the
microbatches before it are dropped; nothing is skipped or repeated).
"""
from __future__ import annotations

from typing import Iterator

from .trainer import TrainerClient

INTEGER_FIELDS = ("input_ids", "position_ids", "labels")  # token ids and positions: int64 with ``int64``
TOKEN_FIELDS = INTEGER_FIELDS + ("loss_mask",)  # [S] per microbatch: [1, S] with ``batch_dim``


class MicrobatchView:
    """One microbatch dict per ``next()`` over a :class:`TrainerClient` (made with ``as_tensors=True``,
    ``encoder=False``). ``int64``: ``input_ids``, ``position_ids`` and ``labels`` as int64 (frameworks'
    embedding and loss take int64); ``batch_dim``: those and ``loss_mask`` shaped ``[1, S]``. A field
    the rank does not receive stays None. ``report`` and ``close`` are the client's."""

    def __init__(self, client: TrainerClient, *, int64: bool = False, batch_dim: bool = False):
        if not client.as_tensors or client.encoder:
            raise ValueError("MicrobatchView needs a TrainerClient with as_tensors=True and encoder=False")
        self.client = client
        self.int64 = int64
        self.batch_dim = batch_dim
        self.step = client.next_step  # the step of the next microbatch
        self.microbatch = 0           # its index in that step
        self._pending: Iterator[dict] | None = None  # the rest of the step being read
        self._started = False

    @property
    def rank(self) -> int:
        return self.client.rank

    def state_dict(self) -> dict:
        """The position: the step and microbatch of the next microbatch (prefetched ones are not counted)."""
        return {"rank": self.rank, "step": self.step, "microbatch": self.microbatch}

    def load_state_dict(self, state: dict) -> None:
        """Continue at ``state`` (this view's, or a :class:`TrainerClient`'s ``{"next_step"}``: microbatch 0)."""
        if self._started:
            raise RuntimeError(f"load_state_dict must be called before iterating (rank {self.rank} is at step "
                               f"{self.step}, microbatch {self.microbatch})")
        step, microbatch = position_of(state)
        self.client.load_state_dict({"rank": self.rank, "next_step": step})
        self.step, self.microbatch = step, microbatch

    def __iter__(self) -> "MicrobatchView":
        return self

    def __next__(self) -> dict:
        self._started = True
        while True:
            if self._pending is None:
                self._pending = self._handed_out(next(self.client))  # the client's end is the view's
            mb = next(self._pending, None)
            if mb is not None:
                return mb
            self._pending = None

    def _handed_out(self, step_batch: list[dict]) -> Iterator[dict]:
        """A step's microbatches from ``self.microbatch`` on; the position moves as each is handed out."""
        step = step_batch[0]["step"] if step_batch else self.client.next_step - 1
        if self.microbatch and self.microbatch >= len(step_batch):
            raise ValueError(f"rank {self.rank}: the state names microbatch {self.microbatch} of step {step}, "
                             f"which has {len(step_batch)} microbatches")
        for index in range(self.microbatch, len(step_batch)):
            last = index == len(step_batch) - 1
            self.step, self.microbatch = (step + 1, 0) if last else (step, index + 1)
            yield self._shaped(step_batch[index])
        self.step, self.microbatch = step + 1, 0

    def _shaped(self, mb: dict) -> dict:
        """The microbatch with the token fields cast (``int64``) and given a batch dimension (``batch_dim``)."""
        out = dict(mb)
        for name in TOKEN_FIELDS:
            value = out.get(name)
            if value is None:
                continue
            if self.int64 and name in INTEGER_FIELDS:
                value = value.long()
            out[name] = value.unsqueeze(0) if self.batch_dim else value
        return out

    def report(self, step: int, losses=None, **timings) -> None:
        """:meth:`TrainerClient.report`: ``losses`` per source ({name: loss}) or one overall number."""
        self.client.report(step, losses, **timings)

    def close(self) -> None:
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def position_of(state: dict) -> tuple[int, int]:
    """(step, microbatch) of a saved position: a :class:`MicrobatchView` state or a TrainerClient's
    ``{"next_step"}``; anything else is an error naming what is missing or wrong."""
    if "step" in state:
        step, microbatch = state["step"], state.get("microbatch", 0)
    elif "next_step" in state:
        step, microbatch = state["next_step"], 0
    else:
        raise ValueError(f"a microbatch position needs 'step' and 'microbatch' (or a TrainerClient's "
                         f"'next_step'), got keys {sorted(state)}")
    for name, value in (("step", step), ("microbatch", microbatch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"a microbatch position's {name} must be an integer >= 0, got {value!r}")
    return step, microbatch
