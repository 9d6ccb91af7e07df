"""A plain accelerate loop over this rank's stream: a tiny random-init Llama, one optimizer step per step.

    OVERLORD_PLANNER=grpc://HOST:PORT torchrun --standalone --nproc-per-node 2 examples/train_accelerate.py \\
        --microbatches 2 --steps 4 --checkpoint-dir runs/accelerate [--resume]

The loader is not passed to ``accelerator.prepare`` (it would dispatch or shard a stream that is this
rank's already) and a resume restores its position, never skipping batches: ``accelerator.save_state``
and ``loader.save`` write into the same directory, ``--resume`` loads both. Each rank prints
``rank R step S loss HEX``. Needs ``pip install -e '.[hf]'``; nothing is downloaded.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import transformers
from accelerate import Accelerator

from flight_overlord import TrainerClient
from flight_overlord.integrations.hf import HFMicrobatches


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--microbatches", type=int, required=True, help="the run's global_batch.microbatches")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps in all (a resume counts on)")
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.microbatches)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    model = transformers.LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)  # the model and optimizer only
    with HFMicrobatches(TrainerClient.from_env(timeout=120)) as loader:
        if args.resume:
            accelerator.load_state(str(args.checkpoint_dir))
            loader.restore(args.checkpoint_dir)
        step = loader.state_dict()["step"]
        total = 0.0
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            total += loss.item()
            if accelerator.sync_gradients:  # the step's last microbatch: one optimizer step done
                os.write(1, f"rank {accelerator.process_index} step {step} loss {total.hex()}\n".encode())
                accelerator.save_state(str(args.checkpoint_dir))
                loader.save(args.checkpoint_dir)
                step, total = step + 1, 0.0
                if step == args.steps:
                    break


if __name__ == "__main__":
    main()
