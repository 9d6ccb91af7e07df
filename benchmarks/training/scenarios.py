"""``training.end_to_end``'s scenarios (a corpus, config overrides, what a rank computes) and the measured
record of one run of a scenario."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np

from benchmarks.common.benchlib import REPO
from benchmarks.training.cost import backbone, context_parallel, hdp_groups, vlm_hybrid, vlm_own_images


@dataclass(frozen=True)
class Corpus:
    config: str            # the base config under configs/
    time_scale: float      # default simulated -> wall seconds factor
    images: bool = False   # needs the demo corpus (with images); else the long-tail source
    overrides: dict = field(default_factory=dict)  # sections for every scenario of the corpus


CORPORA = {
    "text": Corpus("long_tail_32k.yaml", 0.02),
    "vlm": Corpus("vlm.yaml", 0.5, images=True, overrides={"constructor": {"dp_per_constructor": 2}}),
}


@dataclass(frozen=True)
class Scenario:
    """``config``: top-level sections merged over the corpus's config (``strategy: None`` drops it);
    ``compute(microbatches, encoder_inputs) -> [simulated seconds]``, slept one entry at a time."""
    corpus: str
    side: str
    compute: Callable
    config: dict = field(default_factory=dict)
    colocated: bool = False  # benchmarks.delivery.throughput's colocated DataLoader instead of a cluster
    equal_samples: bool = False  # colocated: each rank the same sample count per step, not the same microbatches
    token_share: float = 1.0  # of a row's num_tokens this rank counts: 1/cp under static CP (rows carry the
    # whole sequence's count on every CP rank), so tokens/s counts every token once
    encoder: bool = False    # the strategy has an image graph: TrainerClient(encoder=True)


def static_cp(cp: int, fmt: str) -> Scenario:
    """Balanced DP over ranks / cp groups, each packed sequence split over the cp ranks of its group."""
    split = {"bshd": "whole-buffer split (bshd)", "thd": "per-sequence split (thd)"}[fmt]
    return Scenario("text", f"static CP={cp}, {split}", partial(context_parallel, cp),
                    {"mesh": {"cp": cp, "cp_format": fmt}, "balance": {"method": "greedy"}}, token_share=1 / cp)


SCENARIOS: dict[str, Scenario] = {
    "text-balanced": Scenario("text", "flight_overlord balanced", backbone, {"balance": {"method": "greedy"}}),
    "text-unbalanced": Scenario("text", "flight_overlord unbalanced", backbone, {"balance": {"method": "none"}}),
    "text-colocated": Scenario("text", "colocated DataLoader", backbone, colocated=True),
    "text-colocated-samples": Scenario("text", "colocated DataLoader, equal sample counts", backbone,
                                       colocated=True, equal_samples=True),
    "vlm-hybrid": Scenario("vlm", "flight_overlord hybrid (vlm.py)", vlm_hybrid, encoder=True),
    "vlm-backbone": Scenario("vlm", "flight_overlord balanced backbone, images with their sequence",
                             vlm_own_images, {"strategy": None, "balance": {"method": "greedy"}}),
    "vlm-unbalanced": Scenario("vlm", "flight_overlord unbalanced", vlm_own_images,
                               {"strategy": None, "balance": {"method": "none"}}),
    **{f"text-cp{cp}-{fmt}": static_cp(cp, fmt) for cp in (2, 4) for fmt in ("bshd", "thd")},
    "text-hdp": Scenario("text", "HDP: dynamic CP groups over dp4 x cp2, 16K per rank", hdp_groups,
                         {"mesh": {"cp": 2},
                          "strategy": {"file": str(REPO / "configs" / "strategies" / "long_context_hdp.py"),
                                       "options": {"max_tokens_per_rank": 16384}}}),
}
DEFAULT_SCENARIOS = ("text-balanced,text-unbalanced,text-colocated,text-colocated-samples,"
                     "vlm-hybrid,vlm-backbone,vlm-unbalanced")



@dataclass
class Result:
    name: str
    scenario: Scenario
    records: list[np.ndarray]  # per rank: steps x 8 (see train())
    scale: float
    notes: list[str] = field(default_factory=list)

    def column(self, i: int) -> np.ndarray:
        return np.stack([r[:, i] for r in self.records])  # ranks x steps

    @property
    def step_times(self) -> np.ndarray:
        """Per step, mean over ranks of (end - start); the ranks leave the barrier together."""
        return (self.column(4) - self.column(0)).mean(axis=0)

    @property
    def elapsed(self) -> float:
        return float(self.column(4).max() - self.column(0).min())

    @property
    def tokens_per_s(self) -> float:
        return float(self.column(5).sum()) / self.elapsed

    def share(self, i: int) -> float:
        """Column i's time over all ranks' step time."""
        return float(self.column(i).sum() / (self.column(4) - self.column(0)).sum())

    @property
    def stall(self) -> float:
        """Step time beyond the slowest rank's compute, over step time: the critical path's data waits
        (one rank's wait holds every rank at the barrier) and the barrier's own latency."""
        steps = (self.column(4) - self.column(0)).mean(axis=0)
        return float((steps - self.column(2).max(axis=0)).clip(min=0).sum() / steps.sum())

    @property
    def compute_imbalance(self) -> float:
        """Simulated compute max/mean over ranks, averaged over steps: what the barrier waits for."""
        sim = self.column(6)
        return float(np.mean(sim.max(axis=0) / sim.mean(axis=0)))
