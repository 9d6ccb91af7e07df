"""Hugging Face transformers / accelerate: a rank's stream as the keyword arguments of a causal LM.

    loader = HFMicrobatches(TrainerClient.from_env())
    for batch in loader:                     # one microbatch: input_ids, position_ids, labels, ...
        loss = model(**batch).loss

Two traps this avoids. Our ``labels`` are already next-token targets: passed as ``labels=`` alone,
transformers shifts them once more (a wrong loss, no error), so each batch also carries them as
``shift_labels``, which makes the loss use them as they are. Packed documents attend to each other
unless the model sees where they start: transformers 5.x finds them from ``position_ids`` only with
no attention mask and no cache, so a batch has no ``attention_mask`` and sets ``use_cache=False``.

Resume from the loader's ``state_dict()`` (saved beside the model's checkpoint), never with
``skip_first_batches``, and do not pass the loader to ``accelerator.prepare`` (it would dispatch or
shard a stream that is this rank's already). ``OverlordTrainer`` does both for ``transformers.Trainer``.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..client.microbatches import MicrobatchView
from ..client.trainer import TrainerClient

MODEL_KEYS = ("input_ids", "position_ids", "labels")


def hf_batch(mb: dict, *, flash_attention: bool = False) -> dict:
    """One microbatch of a :class:`MicrobatchView` (int64, ``[1, S]``) as a causal LM's keyword
    arguments. ``flash_attention``: add ``cu_seq_lens_q/k`` and ``max_length_q/k`` (the packed slots of
    ``cu_seqlens_padded``), which flash_attention_2 takes instead of deriving them from positions."""
    missing = [name for name in MODEL_KEYS if mb.get(name) is None]
    if missing:
        raise ValueError(f"microbatch {mb.get('microbatch')} of step {mb.get('step')} has no {', '.join(missing)}: "
                         f"this rank gets metadata only (a pipeline stage or broadcast_at receiver)")
    batch = {name: mb[name] for name in MODEL_KEYS}
    batch["shift_labels"] = mb["labels"]  # already shifted: the loss must not shift them again
    batch["use_cache"] = False           # with a cache, packed documents are not kept apart
    if flash_attention:
        import torch
        cu = mb["cu_seqlens_padded"].to(torch.int32)
        longest = int((cu[1:] - cu[:-1]).max()) if len(cu) > 1 else 0
        batch.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    return batch


class HFMicrobatches:
    """The loader a Hugging Face loop iterates: one :func:`hf_batch` per ``next()``, with the
    position of a :class:`MicrobatchView` as its state (``state_dict`` / ``load_state_dict``)."""

    def __init__(self, client: TrainerClient, *, flash_attention: bool = False):
        self.view = MicrobatchView(client, int64=True, batch_dim=True)
        self.flash_attention = flash_attention
        self.last_step: int | None = None  # the step of the last microbatch handed out (for reports)

    def __iter__(self) -> "HFMicrobatches":
        return self

    def __next__(self) -> dict:
        mb = next(self.view)
        self.last_step = mb["step"]
        return hf_batch(mb, flash_attention=self.flash_attention)

    def state_dict(self) -> dict:
        return self.view.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.view.load_state_dict(state)

    def report(self, step: int, losses=None, **timings) -> None:
        self.view.report(step, losses, **timings)

    def close(self) -> None:
        self.view.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- checkpoint files: one per rank, beside the framework's own -------------------------
    def save(self, directory: str | Path) -> Path:
        path = state_path(directory, self.view.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.state_dict()))
        return path

    def restore(self, directory: str | Path) -> None:
        path = state_path(directory, self.view.rank)
        if not path.exists():
            raise FileNotFoundError(f"no loader state of rank {self.view.rank} in {directory} (expected {path.name})")
        self.load_state_dict(json.loads(path.read_text()))


def state_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"overlord_rank{rank}.json"


def __getattr__(name: str):
    """``OverlordTrainer`` is built on first use, so that importing this module needs no transformers."""
    if name == "OverlordTrainer":
        from ._hf_trainer import OverlordTrainer
        return OverlordTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
