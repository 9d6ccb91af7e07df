"""Megatron-Core on CPU: a tiny ``GPTModel`` with tensor parallelism 2 (gloo) trained from our external data
iterator, read on tensor-parallel rank 0 only.

    OVERLORD_PLANNER=grpc://HOST:PORT torchrun --standalone --nproc-per-node 2 examples/train_megatron.py \\
        --microbatches 2 --steps 4 --checkpoint-dir runs/megatron [--crash-after-step 1]

The run's mesh is ``{dp: 1, tp: 2}`` with ``broadcast_at("TP", others_read=False)``: ``provide_iterators``
gives TP rank 0 the iterator and TP rank 1 nothing; rank 0 broadcasts each batch over the TP group, as
Megatron-LM's ``get_batch_on_this_tp_rank`` does (that function and ``pretrain()`` live in Megatron-LM,
not in megatron-core, and need CUDA). The model is megatron-core's ``GPTModel`` with the local layer
spec and one submodule swapped: its ``DotProductAttention`` needs CUDA and refuses packed sequences, so
``PackedCoreAttention`` (plain SDPA, causal within each document of the THD ``PackedSeqParams``) takes its
place. Each iteration saves model and optimizer per TP rank and the iterator's ``save_state()`` as
``--dataloader-save`` does (``train_dataloader_dprank000.pt``); a rerun with the same ``--checkpoint-dir``
starts the iterator at the saved iteration and restores it. Each rank prints
``rank R step S loss HEX`` and, at the end, ``rank R weights SHA256`` (its TP shard).
Needs ``pip install -e '.[megatron]'``; nothing is downloaded.
"""
from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig

from flight_overlord.integrations.megatron import packed_seq_params, provide_iterators

from tiny_lm import weights_digest

TP = 2
VOCAB, MAX_POSITION = 512, 4096


class PackedCoreAttention(torch.nn.Module):
    """Core attention over THD ``[tokens, heads, dim]``: causal within each slot of ``cu_seqlens_q_padded``."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, **_):
        super().__init__()

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        bounds = packed_seq_params.cu_seqlens_q_padded.long()
        index = torch.arange(query.shape[0])
        slot = torch.searchsorted(bounds, index, right=True)
        allowed = (slot[:, None] == slot[None, :]) & (index[None, :] <= index[:, None])
        heads_first = [t.transpose(0, 1) for t in (query, key, value)]
        out = F.scaled_dot_product_attention(*heads_first, attn_mask=allowed)
        return out.transpose(0, 1).reshape(query.shape[0], -1)


def tiny_gpt() -> GPTModel:
    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, tensor_model_parallel_size=TP,
                               use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0)
    spec = get_gpt_layer_local_spec()
    spec.submodules.self_attention.submodules.core_attention = PackedCoreAttention
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=MAX_POSITION)


def batch_on_this_tp_rank(data_iterator) -> dict:
    """TP rank 0's ``next(data_iterator)``, broadcast to the other ranks of its TP group."""
    holder = [next(data_iterator) if data_iterator is not None else None]
    dist.broadcast_object_list(holder, src=parallel_state.get_tensor_model_parallel_src_rank(),
                               group=parallel_state.get_tensor_model_parallel_group())
    return holder[0]


def microbatch_loss(model: GPTModel, batch: dict) -> torch.Tensor:
    """Megatron's masked mean of the per-token losses (labels are next-token targets already)."""
    targets = batch["labels"].clamp(min=0)  # -100 is no vocabulary id; the loss mask zeroes those positions
    per_token = model(batch["tokens"], batch["position_ids"], None, labels=targets,
                      packed_seq_params=packed_seq_params(batch))
    mask = batch["loss_mask"]
    return (per_token.float() * mask).sum() / mask.sum().clamp(min=1)


class Checkpoint:
    """Model and optimizer per TP rank, the iteration, and the iterator's state as ``--dataloader-save``."""

    def __init__(self, directory: Path, tp_rank: int):
        self.directory, self.tp_rank = directory, tp_rank
        self.model_file = directory / f"mp_rank_{tp_rank:02d}.pt"
        self.dataloader_file = directory / "train_dataloader_dprank000.pt"

    def save(self, iteration: int, model, optimizer, data_iterator) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        _save_atomically({"iteration": iteration, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
                         self.model_file)
        if data_iterator is not None:
            _save_atomically({"dataloader_state_dict": data_iterator.save_state()}, self.dataloader_file)
        dist.barrier()  # every TP rank's part written before any goes on, as Megatron's save_checkpoint does

    def load(self, model, optimizer) -> int:
        """The saved iteration (0 when there is no checkpoint), with model and optimizer restored."""
        if not self.model_file.exists():
            return 0
        saved = torch.load(self.model_file, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        return saved["iteration"]

    def restore_iterator(self, data_iterator) -> None:
        if data_iterator is not None and self.dataloader_file.exists():
            data_iterator.restore_state(torch.load(self.dataloader_file)["dataloader_state_dict"])


def _save_atomically(obj, path: Path) -> None:
    """A crash mid-write leaves the previous file whole."""
    partial = path.with_suffix(".partial")
    torch.save(obj, partial)
    os.replace(partial, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--microbatches", type=int, required=True, help="the run's global_batch.microbatches")
    parser.add_argument("--steps", type=int, default=4, help="iterations in all (a resume counts on)")
    parser.add_argument("--checkpoint-dir", type=Path, required=True, help="resumed from when it holds one")
    parser.add_argument("--crash-after-step", type=int, default=None,
                        help="fault injection for the recovery test: kill -9 this process once that step is saved")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    checkpoint = Checkpoint(args.checkpoint_dir, tp_rank)
    iteration = checkpoint.load(model, optimizer)  # Megatron's args.iteration
    train_iterator, _, _ = provide_iterators(iteration, tp_rank, timeout=120)
    checkpoint.restore_iterator(train_iterator)
    while iteration < args.steps:
        total = 0.0
        for _ in range(args.microbatches):  # get_num_microbatches() next() calls per iteration
            loss = microbatch_loss(model, batch_on_this_tp_rank(train_iterator)) / args.microbatches
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        os.write(1, f"rank {dist.get_rank()} step {iteration} loss {total.hex()}\n".encode())
        iteration += 1
        checkpoint.save(iteration, model, optimizer, train_iterator)
        if iteration - 1 == args.crash_after_step:
            os.kill(os.getpid(), signal.SIGKILL)  # fault injection: a crashed host, after its checkpoint
    os.write(1, f"rank {dist.get_rank()} weights {weights_digest(model)}\n".encode())
    if train_iterator is not None:
        train_iterator.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
