"""TorchTitan (0.3.0): a ``BaseDataLoader`` yielding ``({"input": ids, "positions": pos}, labels)``.

Select it in your ``config_registry.py``: ``Trainer.Config(..., dataloader=OverlordDataLoader.Config(
planner="grpc://HOST:PORT"))`` with ``training.local_batch_size=1`` and ``global_batch_size = dp x our
microbatches`` (TorchTitan pulls ``grad_accum x pp_microbatches`` items per optimizer step). TorchTitan's
checkpoint manager saves ``state_dict()`` per data-parallel rank (key ``dp_rank_{i}``); positions reset
per document, which its block-causal attention reads (``get_attention_masks(positions=...)``). Labels
are already shifted, -100 where ignored. Do not use ``broadcast_at("TP")``: TorchTitan's TP ranks all read.
"""
from __future__ import annotations

from dataclasses import dataclass

from torchtitan.components.dataloader import BaseDataLoader

from ..client.microbatches import MicrobatchView
from ..client.trainer import TrainerClient


class OverlordDataLoader(BaseDataLoader):
    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        planner: str = ""        # grpc://HOST:PORT; empty: $OVERLORD_PLANNER
        timeout: float = 300.0
        num_steps: int | None = None  # steps to read from the start position; None: no end

    def __init__(self, config: "OverlordDataLoader.Config", *, dp_world_size: int, dp_rank: int,
                 local_batch_size: int = 1, rank: int | None = None, **_):
        if local_batch_size != 1:
            raise ValueError(f"OverlordDataLoader: training.local_batch_size must be 1 (one packed microbatch per "
                             f"item), got {local_batch_size}")
        self.config, self.dp_rank, self.dp_world_size = config, dp_rank, dp_world_size
        self._rank = rank  # the global rank; None: the launcher's (torchrun)
        self._view: MicrobatchView | None = None
        self._position: dict | None = None

    def _client(self) -> TrainerClient:
        options = {"timeout": self.config.timeout, "num_steps": self.config.num_steps}
        if self._rank is not None:
            return TrainerClient(self.config.planner, self._rank, **options)
        return TrainerClient.from_env(self.config.planner or None, **options)

    @property
    def view(self) -> MicrobatchView:
        if self._view is None:
            self._view = MicrobatchView(self._client(), int64=True, batch_dim=True)
            if self._position is not None:
                self._view.load_state_dict(self._position)
        return self._view

    def __iter__(self):
        for mb in self.view:
            yield {"input": mb["input_ids"], "positions": mb["position_ids"]}, mb["labels"]

    def state_dict(self) -> dict:
        position = self._view.state_dict() if self._view is not None else self._position
        # the same keys always: DCP loads a checkpoint into the structure state_dict() gives
        position = {name: (position or {}).get(name, 0) for name in ("step", "microbatch")}
        return {f"dp_rank_{self.dp_rank}": position, "world_size": self.dp_world_size}

    def load_state_dict(self, state: dict) -> None:
        """A dp world size other than the saved one is allowed: the Planner plans for the run's mesh."""
        position = state.get(f"dp_rank_{self.dp_rank}")
        if position is None:
            raise ValueError(f"no dataloader state for dp rank {self.dp_rank} (have: {sorted(state)})")
        if self._view is not None:
            self._view.load_state_dict(position)  # refused once iterating
        self._position = position

    def close(self) -> None:
        if self._view is not None:
            self._view.close()
