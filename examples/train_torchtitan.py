"""TorchTitan's components on CPU: a tiny LM trained from ``OverlordDataLoader``, 2 gloo data-parallel ranks.

    OVERLORD_PLANNER=grpc://HOST:PORT torchrun --standalone --nproc-per-node 2 examples/train_torchtitan.py \\
        --microbatches 2 --steps 4 --checkpoint-dir runs/titan [--crash-after-step 1]

TorchTitan's ``Trainer`` needs CUDA, so this script assembles what it would from TorchTitan's own parts:
the loader built by its ``Config.build`` (as the Trainer builds ``config.dataloader``), its
``OptimizersContainer`` and ``LRSchedulersContainer``, and its DCP ``CheckpointManager`` saving model,
optimizer, schedule, train state and every data-parallel rank's loader position each step. A rerun with
the same ``--checkpoint-dir`` loads the latest checkpoint and continues. The model is ``TinyLM`` (not
TorchTitan's Llama, whose block-causal attention is FlexAttention): documents are kept apart from the
positions the loader yields, as TorchTitan's ``get_attention_masks(positions=...)`` does. Each rank
prints ``rank R step S loss HEX`` and, at the end, ``rank R weights SHA256``. Needs
``pip install -e '.[torchtitan]'``; nothing is downloaded.
"""
from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchtitan.components.checkpointer.dcp import CheckpointManager
from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig

from flight_overlord.integrations.torchtitan import OverlordDataLoader

from tiny_lm import TinyLM, weights_digest


class TrainState:
    """The step counter TorchTitan's Trainer checkpoints as ``train_state``."""

    def __init__(self):
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": torch.tensor(self.step)}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


def document_bounds(positions: torch.Tensor) -> torch.Tensor:
    """``cu_seqlens``-style slot bounds from positions that restart at 0 for each document."""
    starts = torch.nonzero(positions == 0).flatten()
    return torch.cat([starts, torch.tensor([len(positions)])])


def microbatch_loss(model: TinyLM, inputs: dict, labels: torch.Tensor) -> torch.Tensor:
    ids, positions = inputs["input"][0], inputs["positions"][0]
    logits = model(ids, positions, document_bounds(positions))
    return F.cross_entropy(logits.float(), labels[0], ignore_index=-100)  # labels are next-token targets already


def all_reduce_gradients(model: torch.nn.Module, world: int) -> None:
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
        parameter.grad /= world


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--microbatches", type=int, required=True, help="the run's global_batch.microbatches")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps in all (a resume counts on)")
    parser.add_argument("--checkpoint-dir", type=Path, required=True, help="resumed from when it holds one")
    parser.add_argument("--crash-after-step", type=int, default=None,
                        help="fault injection for the recovery test: kill -9 this process once that step is saved")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyLM()
    optimizers = OptimizersContainer.Config(
        implementation="for-loop",
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3})],
    ).build(model_parts=[model])
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=optimizers,
                                                                       training_steps=args.steps)
    dataloader = OverlordDataLoader.Config(timeout=120).build(dp_world_size=world, dp_rank=rank, local_batch_size=1)
    state = TrainState()
    checkpoint = CheckpointManager(
        CheckpointManager.Config(enable=True, folder="checkpoint", interval=1, keep_latest_k=0),
        dataloader=dataloader, model_parts=[model], optimizers=optimizers, lr_schedulers=lr_schedulers,
        states={"train_state": state}, sd_adapter=None, base_folder=str(args.checkpoint_dir))
    checkpoint.load(step=-1)  # the latest checkpoint, if any: model, optimizer, schedule, step, data position
    batches = iter(dataloader)
    while state.step < args.steps:
        total = 0.0
        for _ in range(args.microbatches):
            inputs, labels = next(batches)
            loss = microbatch_loss(model, inputs, labels) / args.microbatches
            loss.backward()
            total += loss.item()
        all_reduce_gradients(model, world)
        optimizers.step()
        lr_schedulers.step()
        optimizers.zero_grad()
        os.write(1, f"rank {rank} step {state.step} loss {total.hex()}\n".encode())
        state.step += 1
        checkpoint.save(curr_step=state.step)  # collective: every rank's part is written when it returns
        if state.step - 1 == args.crash_after_step:
            os.kill(os.getpid(), signal.SIGKILL)  # fault injection: a crashed host, after its checkpoint
    os.write(1, f"rank {rank} weights {weights_digest(model)}\n".encode())
    dataloader.close()
    checkpoint.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
