"""Lightning (``pytorch-lightning`` 2.x): a rank's stream as the train dataloader, its position in every
Lightning checkpoint.

    position = OverlordPosition(MicrobatchView(TrainerClient.from_env(), int64=True))
    trainer = pl.Trainer(callbacks=[position, ModelCheckpoint(...)], accumulate_grad_batches=MICROBATCHES, ...)
    trainer.fit(module, train_dataloaders=position.dataloader(), ckpt_path=None or "last")

Lightning fetches one batch ahead of the one it trains on when a loader has no length, so a loader's own
``state_dict`` would be one microbatch late in a checkpoint. The callback saves, instead, the position after
the last microbatch trained on (``on_train_batch_end``); Lightning restores callbacks before it fetches the
first batch, and ``load_state_dict`` continues the view there.
"""
from __future__ import annotations

from pytorch_lightning import Callback
from torch.utils.data import DataLoader

from ..client.microbatches import MicrobatchView
from .torchdata import OverlordDataset


class _PositionsAfter(OverlordDataset):
    """The view's microbatches, noting the view's state after each one by its ``(step, microbatch)``."""

    def __init__(self, view: MicrobatchView, positions: dict):
        super().__init__(view)
        self.positions = positions

    def __iter__(self):
        for mb in self.view:
            self.positions[(mb["step"], mb["microbatch"])] = self.view.state_dict()
            yield mb


class OverlordPosition(Callback):
    """The view's position after the last microbatch trained on, as this callback's checkpoint state."""

    def __init__(self, view: MicrobatchView):
        self.view = view
        self._fetched: dict[tuple[int, int], dict] = {}  # fetched, not yet trained on: the state after each
        self._trained: dict | None = None

    def dataloader(self) -> DataLoader:
        """One packed microbatch per batch (``batch_size=None``); a plain ``DataLoader``, so Lightning keeps
        no state of its own for it. ``num_workers=0``: the client prefetches in a thread already."""
        return DataLoader(_PositionsAfter(self.view, self._fetched), batch_size=None, num_workers=0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        key = (batch["step"], batch["microbatch"])
        self._trained = self._fetched.pop(key)
        for older in [k for k in self._fetched if k < key]:
            del self._fetched[older]

    def state_dict(self) -> dict:
        return dict(self._trained) if self._trained is not None else self.view.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.view.load_state_dict(state)
        self._trained = dict(state)
