"""Two pipeline stages (torch.distributed.pipelining, GPipe) trained from a pp=2 run's streams: the
first stage embeds the tokens and positions it is delivered, the last computes the loss from the
labels it is delivered (neither gets the other's fields). ``--single`` trains the same model without
pipelining on a pp=1 run of the same config and seed, for comparison.

    OVERLORD_PLANNER=grpc://HOST:PORT torchrun --standalone --nproc-per-node 2 examples/train_pp.py --steps 3
    OVERLORD_PLANNER=grpc://HOST:PORT python examples/train_pp.py --single --steps 3

Each step prints ``step S microbatch M loss HEX`` (the exact float) from the stage that has the loss.
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn

from flight_overlord import TrainerClient

VOCAB, HIDDEN, MAX_POSITION = 512, 32, 1024


class FirstStage(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.position = nn.Embedding(MAX_POSITION, HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.GELU())

    def forward(self, tokens, positions):
        return self.mlp(self.embed(tokens) + self.position(positions.clamp(max=MAX_POSITION - 1)))


class LastStage(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.GELU())
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, hidden):
        return self.head(self.mlp(hidden))


def loss_fn(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)


def stacked(step_batch: list[dict], name: str) -> torch.Tensor:
    return torch.stack([mb[name].long() for mb in step_batch])  # [microbatches, S]


def stages() -> tuple[FirstStage, LastStage]:
    torch.manual_seed(0)
    return FirstStage(), LastStage()


def train_single(client: TrainerClient, steps: int) -> None:
    first, last = stages()
    optimizer = torch.optim.SGD([*first.parameters(), *last.parameters()], lr=0.1)
    for step_batch in client:
        step = step_batch[0]["step"]
        losses = [loss_fn(last(first(mb["input_ids"].long()[None], mb["position_ids"].long()[None])),
                          mb["labels"].long()[None]) for mb in step_batch]
        optimizer.zero_grad()
        (sum(losses) / len(losses)).backward()  # as GPipe scales: the mean over microbatches
        optimizer.step()
        for m, loss in enumerate(losses):
            print(f"step {step} microbatch {m} loss {loss.item().hex()}", flush=True)


def train_pipelined(client: TrainerClient, steps: int) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    dist.init_process_group("gloo")
    stage_index = dist.get_rank()  # a pp=2, dp=1 mesh: rank r is stage r
    module = stages()[stage_index]
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    schedule = None
    for step_batch in client:
        step = step_batch[0]["step"]
        if schedule is None:
            stage = PipelineStage(module, stage_index, 2, torch.device("cpu"))
            schedule = ScheduleGPipe(stage, n_microbatches=len(step_batch), loss_fn=loss_fn)
        optimizer.zero_grad()
        if stage_index == 0:
            schedule.step(stacked(step_batch, "input_ids"), stacked(step_batch, "position_ids"))
        else:
            losses: list[torch.Tensor] = []
            schedule.step(target=stacked(step_batch, "labels"), losses=losses)
            for m, loss in enumerate(losses):
                print(f"step {step} microbatch {m} loss {loss.item().hex()}", flush=True)
        optimizer.step()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--single", action="store_true", help="no pipelining: one process on a pp=1 run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.single:
        with TrainerClient(os.environ["OVERLORD_PLANNER"], 0, num_steps=args.steps, timeout=120) as client:
            train_single(client, args.steps)
    else:
        with TrainerClient.from_env(num_steps=args.steps, timeout=120) as client:
            train_pipelined(client, args.steps)


if __name__ == "__main__":
    main()
