"""Train a tiny causal LM with DDP from flight_overlord, checkpointing model, optimizer and data together.

    overlord up configs/demo.yaml                 # prints the Planner's address: grpc://127.0.0.1:PORT
    OVERLORD_PLANNER=grpc://127.0.0.1:PORT torchrun --standalone --nproc-per-node 2 \\
        examples/train_ddp.py --steps 40 --checkpoint-dir runs/ddp-checkpoint

One process per data-parallel rank (the launcher's world size must be the config's mesh), CPU and
gloo; each rank reads its own stream with ``TrainerClient.from_env()``. Every ``--checkpoint-every``
steps rank 0 writes one file with the model, the optimizer and every rank's
``client.state_dict()``. After a crash, bring the data back with ``overlord up CONFIG --resume`` and
run the same command: it resumes from that checkpoint, and the run goes on exactly as if it had
never stopped (same samples, same losses, same weights, bit for bit).

Rank 0 prints one line per step (the loss, its exact float, a digest of the step's sample keys over
every rank) and at the end a digest of the weights, so two runs can be compared line for line.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from flight_overlord import TrainerClient

from tiny_lm import TinyLM, loss_sum

CHECKPOINT = "checkpoint.pt"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40, help="train steps 0 .. STEPS-1 in all (a resume counts on)")
    p.add_argument("--checkpoint-dir", type=Path, required=True, help="checkpoints go here; resumed from if present")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--crash-after-step", type=int, default=None,
                   help="fault injection for the recovery test: after this step rank --crash-rank kills itself "
                        "with SIGKILL, as a crashed host would")
    p.add_argument("--crash-rank", type=int, default=1)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    saved = load_checkpoint(args.checkpoint_dir / CHECKPOINT, model, optimizer, rank)
    start = saved[rank]["next_step"] if saved else 0
    # RANK / WORLD_SIZE from torchrun (checked against the run's mesh), the address from $OVERLORD_PLANNER
    client = TrainerClient.from_env(num_steps=args.steps - start, timeout=120)
    if saved:
        client.load_state_dict(saved[rank])
    ddp = DistributedDataParallel(model)

    with client:
        for step_batch in client:
            step = step_batch[0]["step"]
            loss = train_step(ddp, optimizer, step_batch, world)
            keys = gather_keys(step_batch, world)
            if rank == 0:
                print(f"step {step} loss {loss:.6f} exact {loss.hex()} keys {keys}", flush=True)
            if (step + 1) % args.checkpoint_every == 0:
                save_checkpoint(args.checkpoint_dir / CHECKPOINT, step, model, optimizer, client, rank, world)
            if step == args.crash_after_step and rank == args.crash_rank:
                os.kill(os.getpid(), signal.SIGKILL)
    if rank == 0:
        digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in model.state_dict().values()))
        print(f"weights {digest.hexdigest()}", flush=True)
    # DDP's reducer holds the process group: free it first, or its destructor, run after
    # destroy_process_group() at the function's exit, can wait for ever on gloo's lock
    del ddp
    dist.barrier()
    dist.destroy_process_group()


def train_step(ddp, optimizer, step_batch: list[dict], world: int) -> float:
    """One optimizer step over the rank's microbatches: gradients accumulate locally and are
    all-reduced once, at the last microbatch; the loss is the mean over every rank's labelled tokens."""
    labelled = torch.tensor([sum(int((mb["labels"] != -100).sum()) for mb in step_batch)], dtype=torch.float64)
    dist.all_reduce(labelled)
    total = torch.zeros(1, dtype=torch.float64)
    optimizer.zero_grad(set_to_none=True)
    for i, mb in enumerate(step_batch):
        last = i == len(step_batch) - 1
        with ddp.no_sync() if not last else contextlib.nullcontext():
            logits = ddp(mb["input_ids"], mb["position_ids"], mb["cu_seqlens_padded"])
            summed = loss_sum(logits, mb["labels"])
            # DDP averages gradients over ranks: scale by the world so the step is the global token mean
            (summed * world / labelled.item()).backward()
        total += summed.detach().double()
    optimizer.step()
    dist.all_reduce(total)
    return (total / labelled).item()


def gather_keys(step_batch: list[dict], world: int) -> str:
    """A digest of the step's sample keys on every rank, in rank order."""
    mine = [key for mb in step_batch for key in mb["sample_keys"]]
    every = [None] * world
    dist.all_gather_object(every, mine)
    return hashlib.sha256(repr(every).encode()).hexdigest()[:16]


def save_checkpoint(path: Path, step: int, model, optimizer, client, rank: int, world: int) -> None:
    """Model, optimizer and every rank's data position in one file, written atomically by rank 0."""
    data = [None] * world
    dist.all_gather_object(data, client.state_dict())
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(), "data": data}, tmp)
        os.replace(tmp, path)
        print(f"checkpoint after step {step}", flush=True)
    dist.barrier()


def load_checkpoint(path: Path, model, optimizer, rank: int) -> list[dict] | None:
    """Restore model and optimizer from ``path`` if it exists; every rank's data position (None: no checkpoint)."""
    if not path.exists():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    if rank == 0:
        print(f"resumed after step {saved['step']}", flush=True)
    return saved["data"]


if __name__ == "__main__":
    main()
