"""A tiny random-init Llama trained with transformers' Trainer from this rank's stream.

    OVERLORD_PLANNER=grpc://HOST:PORT torchrun --standalone --nproc-per-node 2 examples/train_hf.py \
        --microbatches 2 --steps 4 --output-dir runs/hf [--resume runs/hf/checkpoint-2]

``--microbatches`` is the run's ``global_batch.microbatches`` (one optimizer step = one of our steps).
Needs ``pip install -e '.[hf]'``. Nothing is downloaded: the model is initialised at random.
"""
from __future__ import annotations

import argparse

import torch
import transformers

from flight_overlord import TrainerClient
from flight_overlord.integrations.hf import HFMicrobatches, OverlordTrainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--microbatches", type=int, required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--output-dir", default="runs/hf")
    parser.add_argument("--resume", default=None, help="a checkpoint directory this script wrote")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    training = transformers.TrainingArguments(
        output_dir=args.output_dir, use_cpu=True, ddp_backend="gloo", max_steps=args.steps, save_steps=1,
        gradient_accumulation_steps=args.microbatches, ignore_data_skip=True, report_to=[], logging_steps=1,
        learning_rate=1e-3)
    with HFMicrobatches(TrainerClient.from_env(timeout=120)) as loader:
        trainer = OverlordTrainer(model=transformers.LlamaForCausalLM(config), args=training, overlord=loader)
        trainer.train(resume_from_checkpoint=args.resume)


if __name__ == "__main__":
    main()
