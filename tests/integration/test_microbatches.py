"""MicrobatchView against a real cluster: one microbatch per ``next()``, a state exact between any
two microbatches (a new client resumed from it continues the undisturbed stream), int64 and
``[1, S]`` options, and an overall loss report."""
from __future__ import annotations

import math
import os
import signal

import pyarrow.flight as fl
import pytest
import torch

from flight_overlord import wire
from flight_overlord.client import MicrobatchView, TrainerClient
from flight_overlord.deploy.launch import LocalCluster

from ..helpers import one_rank_config

STEPS, MICROBATCHES = 4, 2  # one_rank_config's microbatches


@pytest.fixture(scope="module")
def one_rank(corpus, tmp_path_factory):
    with LocalCluster(one_rank_config(tmp_path_factory.mktemp("mb"), corpus)) as cluster:
        yield cluster.planner


def view(planner: str, start: int = 0, num_steps: int | None = None, **options) -> MicrobatchView:
    """Rank 0's view from ``start``; the tests on one cluster read a step each (``num_steps=1``): a step
    is released once served, and a stream bounded so does not read ahead."""
    return MicrobatchView(TrainerClient(planner, 0, start_step=start, num_steps=num_steps, timeout=60), **options)


def signature(mb: dict) -> tuple:
    return mb["step"], mb["microbatch"], tuple(mb["sample_keys"]), tuple(mb["input_ids"].reshape(-1).tolist())


def take(v: MicrobatchView, n: int) -> tuple[list, list]:
    """``n`` microbatches and the state after each."""
    out, states = [], []
    for _ in range(n):
        out.append(next(v))
        states.append(v.state_dict())
    return out, states


def test_one_microbatch_per_next_and_an_exact_state_between_any_two(corpus, tmp_path):
    """The undisturbed stream; then a run whose trainer stops inside a step and whose data plane is
    killed -9, resumed from the view's state: the rest of the stream is the undisturbed one's."""
    total, cut = STEPS * MICROBATCHES, 2 * MICROBATCHES + 1  # stop after microbatch 0 of step 2
    with LocalCluster(one_rank_config(tmp_path / "undisturbed", corpus)) as cluster, view(cluster.planner) as v:
        whole, states = take(v, total)
    assert [(mb["step"], mb["microbatch"]) for mb in whole] == [(s, m) for s in range(STEPS)
                                                                for m in range(MICROBATCHES)]
    assert states == [{"rank": 0, "step": (i + 1) // MICROBATCHES, "microbatch": (i + 1) % MICROBATCHES}
                      for i in range(total)]
    expected = [signature(mb) for mb in whole]

    config = one_rank_config(tmp_path / "disturbed", corpus)
    cluster = LocalCluster(config, supervise=False)
    try:
        cluster.start()
        with view(cluster.planner) as v:
            head, head_states = take(v, cut)
        for pid in cluster.pids():
            os.kill(pid, signal.SIGKILL)
    finally:
        cluster.stop()
    assert head_states[-1] == {"rank": 0, "step": 2, "microbatch": 1}
    with LocalCluster(config, mode="resume") as cluster, view(cluster.planner) as resumed:
        resumed.load_state_dict(head_states[-1])
        tail, _ = take(resumed, total - cut)
    assert [signature(mb) for mb in head + tail] == expected


def test_int64_and_a_batch_dimension(one_rank):
    with view(one_rank, 0, 1) as plain, view(one_rank, 0, 1, int64=True, batch_dim=True) as framed:
        a, b = next(plain), next(framed)
    length = a["input_ids"].shape[0]
    for name in ("input_ids", "position_ids", "labels"):
        assert a[name].dtype == torch.int32 and b[name].dtype == torch.int64 and b[name].shape == (1, length)
        assert torch.equal(a[name].long(), b[name][0])
    assert b["loss_mask"].shape == (1, length) and torch.equal(b["loss_mask"][0], a["loss_mask"])
    assert b["cu_seqlens"].dtype == torch.int32 and b["sample_keys"] == a["sample_keys"]


def test_bad_states_and_a_late_load_are_refused(one_rank):
    with view(one_rank, 1, 1) as v:
        with pytest.raises(ValueError, match="'step' and 'microbatch'.*got keys \\['position'\\]"):
            v.load_state_dict({"position": 3})
        with pytest.raises(ValueError, match="microbatch must be an integer >= 0, got -1"):
            v.load_state_dict({"step": 1, "microbatch": -1})
        v.load_state_dict({"step": 1, "microbatch": MICROBATCHES})
        with pytest.raises(ValueError, match=f"microbatch {MICROBATCHES} of step 1, which has {MICROBATCHES}"):
            next(v)
        with pytest.raises(RuntimeError, match="before iterating"):
            v.load_state_dict({"step": 1, "microbatch": 0})


def test_an_overall_loss_is_reported_and_shown_in_status(one_rank):
    with view(one_rank, 2, 1) as v:
        mb = next(v)
        v.report(mb["step"], losses=2.5)
        with pytest.raises(fl.FlightError, match="overall loss must be a finite number, got nan"):
            v.client.report(mb["step"], losses=math.nan)
    with fl.FlightClient(one_rank) as client:
        status = wire.call(client, "status", {})
    assert status["trainer_losses"]["0"] == {"step": mb["step"], "loss": 2.5}


def test_torchdata_stateful_dataloader_carries_the_position(one_rank):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    from flight_overlord.integrations.torchdata import OverlordDataset

    def loader(steps: int, **options):  # steps counted from where it starts: step 3, or the loaded state
        return stateful.StatefulDataLoader(OverlordDataset(view(one_rank, 3, steps, **options)), batch_size=None,
                                           num_workers=0)

    first = loader(2)
    items = iter(first)
    head = [next(items) for _ in range(3)]  # stops inside step 4
    state = first.state_dict()
    first.dataset.view.close()
    assert state["dataset_state"] == {"rank": 0, "step": 4, "microbatch": 1}
    assert [(mb["step"], mb["microbatch"]) for mb in head] == [(3, 0), (3, 1), (4, 0)]
    second = loader(1, int64=True)
    second.load_state_dict(state)
    tail = list(second)
    second.dataset.view.close()
    assert [(mb["step"], mb["microbatch"]) for mb in tail] == [(4, 1)] and tail[0]["input_ids"].dtype == torch.int64


def test_lightning_checkpoint_carries_the_position_of_the_last_microbatch_trained(one_rank, tmp_path):
    """Lightning fits 2 optimizer steps from step 5 (its fetcher already holding step 7's first microbatch),
    checkpointed by its ModelCheckpoint; a new Trainer resumed from last.ckpt trains on exactly the
    microbatches that follow, none twice or skipped."""
    pl = pytest.importorskip("pytorch_lightning", reason="pytorch-lightning not installed")
    from flight_overlord.integrations.lightning import OverlordPosition

    trained = []

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(512, 8)
            self.head = torch.nn.Linear(8, 512)

        def training_step(self, mb, batch_idx):
            trained.append((mb["step"], mb["microbatch"], tuple(mb["sample_keys"])))
            logits = self.head(self.embed(mb["input_ids"]))
            return torch.nn.functional.cross_entropy(logits, mb["labels"], ignore_index=-100)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(steps: int, num_steps: int, resume: str | None) -> tuple:
        position = OverlordPosition(view(one_rank, 5, num_steps, int64=True))
        saving = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, save_last=True)
        trainer = pl.Trainer(max_steps=steps, accumulate_grad_batches=MICROBATCHES, callbacks=[position, saving],
                             accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0)
        trainer.fit(Tiny(), train_dataloaders=position.dataloader(), ckpt_path=resume)
        position.view.close()
        return trainer.global_step

    assert fit(2, 3, None) == 2  # steps 5 and 6 trained; step 7 read ahead, not yet trained
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)["callbacks"]
    assert saved["OverlordPosition"] == {"rank": 0, "step": 7, "microbatch": 0}  # not step 7's second
    assert fit(4, 2, str(tmp_path / "last.ckpt")) == 4
    assert [(s, m) for s, m, _ in trained] == [(s, m) for s in range(5, 9) for m in range(MICROBATCHES)]
    keys = [key for *_, keys in trained for key in keys]
    assert len(keys) == len(set(keys))  # no sample trained on twice
