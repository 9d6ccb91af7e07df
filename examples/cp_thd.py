"""Consume context-parallel THD shares: each CP rank holds its share of every packed sequence and the
loss over the shares equals the loss over the whole sequences.

    overlord up CONFIG        # a mesh with cp > 1 (cp_format: thd, the default); prints grpc://HOST:PORT
    OVERLORD_PLANNER=grpc://HOST:PORT torchrun --standalone --nproc-per-node WORLD examples/cp_thd.py --cp 2

Rank ``dp*cp + c`` is CP rank ``c`` of data-parallel group ``dp`` (pp = tp = 1). Under THD each
sample's slot of ``cu_seqlens_padded`` is cut into 2*cp chunks and rank c holds chunks c and
2*cp-1-c (``token_ranges`` says where they sit in the packed buffer). A CP rank computes its own
queries and gathers keys and values from its CP group (what ring attention does piece by piece),
then attends with the reference attention of tiny_lm (causal within each slot). The same model over
the whole buffer, rebuilt from every share, is the no-CP loss; the example fails if they differ.
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from flight_overlord import TrainerClient

from tiny_lm import TinyLM, attend, loss_sum

TOLERANCE = 1e-5  # relative: the two sums add the same terms in another order


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cp", type=int, default=2, help="the config's mesh.cp")
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.cp:
        raise SystemExit(f"world size {world} is not a multiple of --cp {args.cp}")
    groups = [dist.new_group(list(range(d * args.cp, (d + 1) * args.cp))) for d in range(world // args.cp)]
    group = groups[rank // args.cp]
    model = TinyLM().eval()  # the same weights on every rank (same seed)

    failed = False
    with TrainerClient.from_env(num_steps=args.steps, timeout=120) as client, torch.no_grad():
        for step_batch in client:
            sums = torch.zeros(4, dtype=torch.float64)  # cp loss, no-cp loss, labelled tokens (cp), (no-cp)
            for mb in step_batch:
                sums += share_and_whole(model, mb, group, args.cp)
            dist.all_reduce(sums, group=group)
            cp_loss, whole_loss = (sums[0] / sums[2]).item(), (sums[1] / sums[3]).item()
            if rank % args.cp == 0:
                print(f"step {step_batch[0]['step']}: cp loss {cp_loss:.9f} no-cp loss {whole_loss:.9f}", flush=True)
            failed |= abs(cp_loss - whole_loss) > TOLERANCE * abs(whole_loss)
    dist.destroy_process_group()
    if failed:
        raise SystemExit("the CP loss differs from the whole-sequence loss")


def share_and_whole(model: TinyLM, mb: dict, group, cp: int) -> torch.Tensor:
    """This rank's (cp loss sum, whole loss sum / cp, labelled tokens of its share, of the whole / cp):
    summed over the CP group they are the two losses' sums and counts."""
    index = buffer_index(mb["token_ranges"])
    x, q, k, v = model.qkv_of(mb["input_ids"], mb["position_ids"])
    keys, values, key_index = (torch.cat(gather(t, group, cp)) for t in (k, v, index))
    logits = model.finish(x, attend(q, keys, values, index, key_index, mb["cu_seqlens_padded"]))
    cp_sum, cp_count = loss_sum(logits, mb["labels"]), (mb["labels"] != -100).sum()

    # No CP: the whole packed buffer, every share put back where token_ranges says
    length = int(mb["cu_seqlens_padded"][-1])
    whole = {}
    for name in ("input_ids", "position_ids", "labels"):
        buffer = torch.full((length,), -100, dtype=mb[name].dtype)
        buffer[key_index] = torch.cat(gather(mb[name], group, cp))
        whole[name] = buffer
    if (whole["input_ids"] == -100).any():
        raise SystemExit("the CP shares do not tile the packed buffer")
    whole_logits = model(whole["input_ids"], whole["position_ids"], mb["cu_seqlens_padded"])
    whole_sum, whole_count = loss_sum(whole_logits, whole["labels"]), (whole["labels"] != -100).sum()
    return torch.tensor([cp_sum, whole_sum / cp, cp_count, whole_count / cp], dtype=torch.float64)


def buffer_index(token_ranges: list[int]) -> torch.Tensor:
    """Positions in the packed buffer of this rank's tokens: token_ranges is flat [start, end, ...]."""
    return torch.cat([torch.arange(token_ranges[i], token_ranges[i + 1]) for i in range(0, len(token_ranges), 2)])


def gather(tensor: torch.Tensor, group, cp: int) -> list[torch.Tensor]:
    """Every CP rank's tensor, in CP rank order (THD shares are the same size on every CP rank)."""
    out = [torch.empty_like(tensor) for _ in range(cp)]
    dist.all_gather(out, tensor.contiguous(), group=group)
    return out


if __name__ == "__main__":
    main()
