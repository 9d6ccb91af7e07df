"""torchdata's ``StatefulDataLoader`` (and so Lightning, which saves any loader with a ``state_dict``):
a rank's stream as the ``IterableDataset`` it wants, whose position travels in the loader's state.

    loader = StatefulDataLoader(OverlordDataset(MicrobatchView(TrainerClient.from_env())),
                                batch_size=None, num_workers=0)
    state = loader.state_dict()          # ours under "dataset_state": the next step and microbatch

``batch_size=None``: each item is one packed microbatch already. ``num_workers=0``: the client prefetches
in a thread of its own, and a worker process would hold a second client of the same rank.
"""
from __future__ import annotations

from torch.utils.data import IterableDataset

from ..client.microbatches import MicrobatchView


class OverlordDataset(IterableDataset):
    """One microbatch dict per item, from a :class:`MicrobatchView`, with its position as the state."""

    def __init__(self, view: MicrobatchView):
        super().__init__()
        self.view = view

    def __iter__(self):
        return self.view

    def state_dict(self) -> dict:
        return self.view.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.view.load_state_dict(state)
