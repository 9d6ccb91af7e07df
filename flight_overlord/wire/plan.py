"""The plan a Data Constructor receives for one step: one typed view, to and from the wire.

Samples are numbered by their position in ``keys``; microbatches and encoder rows refer to them by
that index. ``fetch`` says where each sample lives: the locations of its loader actor (the active
one first, then its shadows, any of which can serve it) and, per sample, ``[epoch, file,
row_group, row, consumers]`` (``consumers``: how many constructors fetch it in all).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FetchGroup:
    source: str                   # the owning loader actor (a process may host several)
    actor: int
    locations: list[str]          # where it is served: the active process first, then shadows
    items: list[int]              # indices into ConstructorPlan.keys
    samples: list[list]           # [epoch, file, row_group, row, consumers] per item


@dataclass
class ConstructorPlan:
    step: int
    axis: str                     # the distribution axis: what a bucket is
    broadcast: list[str]          # dimensions only rank 0 of which gets tokens
    capacity: int                 # tokens per packed microbatch
    keys: list[str]
    lengths: list[int]            # planned length of each sample (the plan may truncate one to the capacity)
    microbatches: dict[int, list[list[int]]]  # bucket -> microbatches -> sample indices, in order
    fetch: list[FetchGroup]
    encoder_axis: str | None = None
    encoder: dict[int, list[list[int]]] | None = None  # bucket -> [sample index, image, owner bucket, owner mb]
    extra: dict = field(default_factory=dict)  # "hdp": bucket -> microbatches -> [group size, first rank] per sample

    def to_wire(self) -> dict:
        # Field by field, without asdict's deep copy of every nested list (the wire encoding copies
        # anyway) nor dataclasses.fields() per object: on the Planner's hot path, once per step and constructor.
        out = dict(vars(self))
        out["fetch"] = [dict(vars(g)) for g in self.fetch]
        out["microbatches"] = {str(b): v for b, v in self.microbatches.items()}
        if self.encoder is not None:
            out["encoder"] = {str(b): v for b, v in self.encoder.items()}
        return out

    @classmethod
    def from_wire(cls, raw: dict) -> "ConstructorPlan":
        raw = dict(raw)
        raw["microbatches"] = {int(b): v for b, v in raw["microbatches"].items()}
        if raw.get("encoder") is not None:
            raw["encoder"] = {int(b): v for b, v in raw["encoder"].items()}
        raw["fetch"] = [FetchGroup(**g) for g in raw["fetch"]]
        return cls(**raw)
