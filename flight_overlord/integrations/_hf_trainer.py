"""``transformers.Trainer`` reading a rank's stream (imported by ``hf.OverlordTrainer`` on first use)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Protocol

from transformers import Trainer, TrainerCallback


class Positioned(Protocol):
    """What the Trainer needs of its loader (``hf.HFMicrobatches``): batches, and its position saved
    into and restored from a checkpoint directory."""

    def __iter__(self) -> Iterator[dict]: ...
    def save(self, directory: str | Path) -> Path: ...
    def restore(self, directory: str | Path) -> None: ...


class _SaveLoaderState(TrainerCallback):
    """Writes every rank's loader position into each checkpoint directory, beside the model's."""

    def __init__(self, loader: Positioned):
        self.loader = loader

    def on_save(self, args, state, control, **kwargs):
        self.loader.save(f"{args.output_dir}/checkpoint-{state.global_step}")


class OverlordTrainer(Trainer):
    """A ``Trainer`` whose training data is ``overlord`` (an :class:`HFMicrobatches`). Set
    ``max_steps`` (the stream has no length), ``gradient_accumulation_steps`` to the run's microbatches
    per step (one optimizer step = one of our steps) and ``ignore_data_skip=True``; ``train(
    resume_from_checkpoint=DIR)`` restores the loader's position from DIR first."""

    def __init__(self, *args, overlord: Positioned, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.args.ignore_data_skip:
            raise ValueError("OverlordTrainer needs TrainingArguments(ignore_data_skip=True): the loader resumes "
                             "from its own state, skipping batches would read them again")
        if self.args.max_steps <= 0:
            raise ValueError("OverlordTrainer needs TrainingArguments(max_steps=N): the stream has no length")
        self.overlord = overlord
        self.add_callback(_SaveLoaderState(overlord))

    def get_train_dataloader(self):
        return self.overlord  # not through accelerator.prepare: the stream is this rank's already

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if isinstance(resume_from_checkpoint, str):
            self.overlord.restore(resume_from_checkpoint)
        return super().train(resume_from_checkpoint, *args, **kwargs)
