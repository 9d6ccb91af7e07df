"""Megatron-Core's and TorchTitan's adapters with their own classes on CPU, against a real pp=2 run
(rank 0 the first pipeline stage, rank 1 the last): Megatron's batch keys and types per stage and
THD ``PackedSeqParams``, ``save_state`` through ``train_dataloader_dprank000.pt``; TorchTitan's
``BaseDataLoader`` built by its ``Config.build``, stopped inside a step, saved and loaded by TorchTitan's
own CheckpointManager (DCP), and the stream continued from there by Megatron's iterator."""
from __future__ import annotations

import pyarrow.flight as fl
import pytest
import torch

from flight_overlord import wire
from flight_overlord.client import TrainerClient
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.harness import each_rank

from ..helpers import ONE_RANK_BATCH, write_config

MICROBATCHES = ONE_RANK_BATCH["microbatches"]
# TorchTitan's block-causal masks read positions on every stage: the last stage gets them too
STAGES = 'def build(s):\n    return s.pipeline_stages(last=["labels", "loss_mask", "position_ids"])\n'


@pytest.fixture(scope="module")
def pp2(corpus, tmp_path_factory):
    directory = tmp_path_factory.mktemp("pp2")
    (directory / "stages.py").write_text(STAGES)
    with LocalCluster(write_config(directory, corpus, mesh={"pp": 2, "dp": 1}, global_batch=ONE_RANK_BATCH,
                                   strategy="stages.py")) as cluster:
        yield cluster.planner


class _Plain:
    """Optimizer and LR scheduler stand-ins: the checkpoint manager only asks them for a state."""

    def __init__(self):
        self.state = {"lr": torch.tensor(0.5)}

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.state = state


def checkpoint_round_trip(titan, loader, folder, rank: int) -> dict:
    """The loader saved by TorchTitan's own CheckpointManager (DCP) and loaded into a fresh one, as a
    restarted TorchTitan job does; the fresh loader's state."""
    from torchtitan.components.checkpointer.dcp import CheckpointManager

    def manager(dataloader):
        config = CheckpointManager.Config(enable=True, folder="checkpoint", interval=1, keep_latest_k=0)
        return CheckpointManager(config, dataloader=dataloader, model_parts=[torch.nn.Linear(2, 2)],
                                 optimizers=_Plain(), lr_schedulers=_Plain(), states={}, sd_adapter=None,
                                 base_folder=str(folder))
    assert manager(loader).save(curr_step=1)
    fresh = titan.OverlordDataLoader.Config(planner="unused").build(dp_world_size=1, dp_rank=0, rank=rank)
    assert manager(fresh).load(step=1)
    return fresh.state_dict()


def test_torchtitan_loader_then_megatron_iterator_per_stage(pp2, tmp_path):
    titan = pytest.importorskip("flight_overlord.integrations.torchtitan", reason="torchtitan not installed")
    megatron = pytest.importorskip("flight_overlord.integrations.megatron")
    pytest.importorskip("megatron.core.packed_seq_params", reason="megatron-core not installed")
    titan_items, titan_states = {}, {}

    def titan_rank(rank: int) -> None:  # built as TorchTitan's trainer builds it
        loader = titan.OverlordDataLoader.Config(planner=pp2, timeout=60, num_steps=2).build(
            dp_world_size=1, dp_rank=0, local_batch_size=1, rank=rank, tokenizer=None, seq_len=512)
        loader.load_state_dict({"dp_rank_0": {"step": 0, "microbatch": 1}, "world_size": 1})
        items = iter(loader)
        titan_items[rank] = [next(items) for _ in range(MICROBATCHES)]  # stops inside step 1
        loader.close()
        loaders[rank] = loader

    loaders = {}
    each_rank(titan_rank, 2, timeout=120)
    for rank in range(2):
        titan_states[rank] = checkpoint_round_trip(titan, loaders[rank], tmp_path / f"rank{rank}", rank)
        assert titan_states[rank] == {"dp_rank_0": {"step": 1, "microbatch": 1}, "world_size": 1}
        for inputs, labels in titan_items[rank]:
            assert inputs["positions"].dtype == torch.int64 and inputs["positions"].shape[0] == 1
            assert (inputs["input"] is None) == (rank == 1) and (labels is None) == (rank == 0)
    first, last = titan_items[0][0], titan_items[1][0]
    assert torch.equal(first[0]["positions"], last[0]["positions"])  # the same microbatch on both stages

    saved = tmp_path / "train_dataloader_dprank000.pt"  # Megatron's --dataloader-save file
    batches = {}

    def megatron_rank(rank: int) -> None:
        it = megatron.OverlordIterator(TrainerClient(pp2, rank, num_steps=2, timeout=60))
        it.restore_state(titan_states[rank]["dp_rank_0"])
        batches[rank] = [next(it) for _ in range(MICROBATCHES)]
        if rank == 0:
            torch.save({"dataloader_state_dict": it.save_state()}, saved)
        it.close()

    each_rank(megatron_rank, 2, timeout=120)
    assert torch.load(saved)["dataloader_state_dict"] == {"rank": 0, "step": 2, "microbatch": 1}
    for one, other in zip(batches[0], batches[1]):
        assert set(one) == set(megatron.BATCH_KEYS)
        assert one["tokens"].dtype == torch.int64 and one["tokens"].shape == (1, ONE_RANK_BATCH["context_length"])
        assert one["labels"] is None and one["loss_mask"] is None                   # the first stage
        assert other["tokens"] is None and other["loss_mask"].dtype == torch.float32  # the last stage
        assert other["labels"].dtype == torch.int64
        assert torch.equal(other["loss_mask"][0] > 0, other["labels"][0] != -100)
        assert one["cu_seqlens"].dtype == torch.int32 and one["cu_seqlens"].shape[0] == 1
        assert torch.equal(one["cu_seqlens"], other["cu_seqlens"]) and one["max_seqlen"].dtype == torch.int32
        params = megatron.packed_seq_params(one)
        assert params.qkv_format == "thd" and params.max_seqlen_q == int(one["max_seqlen"][0])
        assert torch.equal(params.cu_seqlens_q_padded, one["cu_seqlens_padded"][0])
        assert torch.equal(one["tokens"][0, 1:][other["labels"][0, :-1] != -100],
                           other["labels"][0, :-1][other["labels"][0, :-1] != -100])  # labels: the next tokens


def test_megatron_tp_ranks_that_never_read_hold_nothing_back(corpus, tmp_path):
    """broadcast_at("TP", others_read=False): Megatron reads on TP rank 0 only; the constructor does not
    keep steps for TP rank 1, which never calls next() (with others_read left True, every step stays
    staged for it)."""
    megatron = pytest.importorskip("flight_overlord.integrations.megatron")
    (tmp_path / "tp.py").write_text('def build(s):\n    return s.broadcast_at("TP", others_read=False)\n')
    steps = 12
    path = write_config(tmp_path, corpus, mesh={"dp": 1, "tp": 2}, global_batch=ONE_RANK_BATCH, strategy="tp.py")
    with LocalCluster(path) as cluster:
        launcher = {"WORLD_SIZE": "2"}  # as torchrun sets it for the two TP ranks
        assert megatron.provide_iterators(0, 1, planner=cluster.planner, env={**launcher, "RANK": "1"}) == (
            None, None, None)  # TP rank 1 gets no iterator: it never reads
        it, valid, test = megatron.provide_iterators(0, 0, planner=cluster.planner, env={**launcher, "RANK": "0"},
                                                     num_steps=steps, timeout=60)
        batches = list(it)
        it.close()
        assert valid is None and test is None
        with fl.FlightClient(cluster.planner) as planner:
            location = wire.call(planner, "status", {})["constructors"]["0"]
        with fl.FlightClient(location) as constructor:
            staged = wire.call(constructor, "status", {})["staged_steps"]
    assert len(batches) == steps * MICROBATCHES and all(b["tokens"] is not None for b in batches)
    keep = 2 + 2  # the constructor keeps 2 + prefetch steps behind its slowest reader
    assert staged and min(staged) >= steps - keep - 1, staged
