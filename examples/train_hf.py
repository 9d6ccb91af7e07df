"""A tiny random-init Llama trained with transformers' Trainer from this rank's stream.

    OVERLORD_PLANNER=grpc://HOST:PORT torchrun --standalone --nproc-per-node 2 examples/train_hf.py \\
        --microbatches 2 --steps 4 --output-dir runs/hf [--resume runs/hf/checkpoint-2]

``--microbatches`` is the run's ``global_batch.microbatches`` (one optimizer step = one of our steps).
Every step is checkpointed (model, optimizer, and each rank's loader position, ``overlord_rank{R}.json``);
``--resume DIR`` continues from one. Each rank prints ``rank R step S loss HEX`` per step (the exact sum
of its microbatch losses) and rank 0 ``weights DIGEST`` at the end, so runs compare line for line.
Needs ``pip install -e '.[hf]'``. Nothing is downloaded: the model is initialised at random.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import signal

import torch
import transformers

from flight_overlord import TrainerClient
from flight_overlord.integrations.hf import HFMicrobatches, OverlordTrainer


class LossLines(transformers.TrainerCallback):
    """Prints each optimizer step's summed microbatch loss on this rank; optionally crashes after a step."""

    def __init__(self, trainer: "LoggedTrainer", crash_after: int | None):
        self.trainer, self.crash_after = trainer, crash_after

    def on_step_end(self, args, state, control, **kwargs):
        rank = int(os.environ.get("RANK", 0))
        line = f"rank {rank} step {state.global_step - 1} loss {self.trainer.take_loss().hex()}\n"
        os.write(1, line.encode())  # one write: the ranks share stdout, a line must not be cut by another

    def on_save(self, args, state, control, **kwargs):
        if self.crash_after is not None and state.global_step - 1 == self.crash_after:
            os.kill(os.getpid(), signal.SIGKILL)  # fault injection: a crashed host, after its checkpoint


class LoggedTrainer(OverlordTrainer):
    """Keeps the exact loss of each microbatch the step trained on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._losses: list[float] = []

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        self._losses.append((loss[0] if isinstance(loss, tuple) else loss).item())
        return loss

    def take_loss(self) -> float:
        total, self._losses = float(sum(self._losses)), []
        return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--microbatches", type=int, required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--output-dir", default="runs/hf")
    parser.add_argument("--resume", default=None, help="a checkpoint directory this script wrote")
    parser.add_argument("--crash-after-step", type=int, default=None,
                        help="fault injection for the recovery test: kill -9 this process once that step is saved")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    training = transformers.TrainingArguments(
        output_dir=args.output_dir, use_cpu=True, ddp_backend="gloo", max_steps=args.steps, save_steps=1,
        gradient_accumulation_steps=args.microbatches, ignore_data_skip=True, report_to=[], logging_steps=1,
        learning_rate=1e-3, disable_tqdm=True, seed=0, data_seed=0)
    with HFMicrobatches(TrainerClient.from_env(timeout=120)) as loader:
        trainer = LoggedTrainer(model=transformers.LlamaForCausalLM(config), args=training, overlord=loader)
        trainer.add_callback(LossLines(trainer, args.crash_after_step))
        trainer.train(resume_from_checkpoint=args.resume)
        if trainer.is_world_process_zero():
            digest = hashlib.sha256()
            for name, tensor in sorted(trainer.model.state_dict().items()):
                digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
            print(f"weights {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
