"""Megatron-Core: our stream as Megatron's external data iterator (``--dataloader-type external``).

Megatron calls ``next()`` once per microbatch, ``get_num_microbatches()`` times per iteration, so
iteration i is our step i and ``start_step = args.iteration`` resumes exactly; ``save_state()`` is what
``--dataloader-save`` writes per data-parallel rank (``train_dataloader_dprank{dp:03d}.pt``), and the
provider restores it. Batches carry Megatron's keys and types (``get_batch_on_this_tp_rank``): tokens,
labels and position_ids int64 ``[1, S]``, loss_mask float32, cu_seqlens / cu_seqlens_padded int32
``[1, N]``, max_seqlen int32 ``[1]``; a key the rank's pipeline stage does not receive is None (the
first stage gets tokens and positions, the last labels and loss mask). Use it with
``broadcast_at("TP", others_read=False)`` in the strategy: only tensor-parallel rank 0 of a stage reads.
"""
from __future__ import annotations

from ..client.microbatches import MicrobatchView
from ..client.trainer import TrainerClient

RENAMED = {"input_ids": "tokens"}  # ours -> Megatron's
BATCH_KEYS = ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "cu_seqlens_padded", "max_seqlen")


def megatron_batch(mb: dict) -> dict:
    """One microbatch of a :class:`MicrobatchView` (int64, ``[1, S]``) with Megatron's keys and types."""
    import torch
    batch = {RENAMED.get(name, name): mb.get(name) for name in ("input_ids", "labels", "position_ids")}
    batch["loss_mask"] = None if mb.get("loss_mask") is None else mb["loss_mask"].to(torch.float32)
    cu, padded = mb["cu_seqlens"].to(torch.int32), mb["cu_seqlens_padded"].to(torch.int32)
    batch["cu_seqlens"], batch["cu_seqlens_padded"] = cu[None], padded[None]
    longest = int((padded[1:] - padded[:-1]).max()) if len(padded) > 1 else 0
    batch["max_seqlen"] = torch.tensor([longest], dtype=torch.int32)
    return batch


def packed_seq_params(batch: dict):
    """Megatron-Core's THD ``PackedSeqParams`` of a :func:`megatron_batch` (one microbatch)."""
    from megatron.core.packed_seq_params import PackedSeqParams
    cu, padded = batch["cu_seqlens"][0], batch["cu_seqlens_padded"][0]
    longest = int(batch["max_seqlen"][0])
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=padded,
                           cu_seqlens_kv_padded=padded, max_seqlen_q=longest, max_seqlen_kv=longest)


class OverlordIterator:
    """Megatron's training data iterator over one rank's stream."""

    def __init__(self, client: TrainerClient):
        self.view = MicrobatchView(client, int64=True, batch_dim=True)

    def __iter__(self) -> "OverlordIterator":
        return self

    def __next__(self) -> dict:
        return megatron_batch(next(self.view))

    def save_state(self) -> dict:
        """What ``--dataloader-save`` writes for this data-parallel rank."""
        return self.view.state_dict()

    def restore_state(self, state: dict) -> None:
        self.view.load_state_dict(state)

    def close(self) -> None:
        self.view.close()


def provide_iterators(start_step: int, tp_rank: int, *, planner: str | None = None, env: dict | None = None,
                      **client_options) -> tuple:
    """(train, valid, test) iterators of this process: its rank's stream from ``start_step`` on tensor-
    parallel rank 0, nothing on the others (with ``broadcast_at("TP", others_read=False)`` they never
    read; Megatron broadcasts to them); no validation or test data. The rank and world size are the
    launcher's (``env``, default the process environment), the Planner ``planner`` or ``$OVERLORD_PLANNER``."""
    if tp_rank != 0:
        return None, None, None
    client = TrainerClient.from_env(planner, env=env, start_step=start_step, **client_options)
    return OverlordIterator(client), None, None


def overlord_dataloaders_provider(train_val_test_num_samples=None, vp_stage=None):
    """Megatron-LM's ``train_valid_test_datasets_provider`` for ``pretrain()``: :func:`provide_iterators`
    at ``args.iteration`` (a resume continues exactly there)."""
    from megatron.core import parallel_state
    from megatron.training import get_args  # Megatron-LM's, beside megatron-core
    return provide_iterators(get_args().iteration, parallel_state.get_tensor_model_parallel_rank())


overlord_dataloaders_provider.is_distributed = True  # Megatron calls it on every rank; it picks its readers
