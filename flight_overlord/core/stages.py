"""What each pipeline stage receives of a microbatch (pure logic, no I/O).

Every stage gets the sequence boundaries (``cu_seqlens``, ``cu_seqlens_padded``), the sample keys and
which positions it holds (``token_ranges``); the *token fields* below go only where a stage needs
them. The default is what Megatron-Core's stages read (``megatron/core/utils.py::
get_batch_on_this_tp_rank``): the first stage embeds tokens at their positions (and, for
image-text, the pixels), the last computes the loss from labels and the loss mask, the middle ones
need nothing but the boundaries. With one stage, that stage is first and last: it gets everything.
"""
from __future__ import annotations

from dataclasses import dataclass

TOKEN_FIELDS = ("input_ids", "position_ids", "labels", "loss_mask", "pixel_values")
ALL_FIELDS = frozenset(TOKEN_FIELDS)


def check_fields(fields, where: str) -> frozenset[str]:
    """``fields`` as a frozenset of token field names; an unknown name is an error naming ``where``."""
    if isinstance(fields, str):
        fields = [fields]
    fields = frozenset(fields)
    unknown = sorted(fields - ALL_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))} "
                         f"(fields: {', '.join(TOKEN_FIELDS)})")
    return fields


@dataclass(frozen=True)
class StageContents:
    """The token fields of the first, middle and last pipeline stages."""
    first: frozenset[str] = frozenset({"input_ids", "position_ids", "pixel_values"})
    middle: frozenset[str] = frozenset()
    last: frozenset[str] = frozenset({"labels", "loss_mask"})

    @classmethod
    def of(cls, first=None, middle=None, last=None) -> "StageContents":
        """The defaults, with the stages named replaced (each a collection of field names)."""
        default = cls()
        return cls(*(default_value if given is None else check_fields(given, f"pipeline_stages({name}=...)")
                     for name, given, default_value in (("first", first, default.first),
                                                        ("middle", middle, default.middle),
                                                        ("last", last, default.last))))

    def fields(self, stage: int, stages: int) -> frozenset[str]:
        """The token fields stage ``stage`` of ``stages`` receives."""
        if not 0 <= stage < stages:
            raise ValueError(f"pipeline stage {stage} is outside 0..{stages - 1}")
        out = frozenset()
        if stage == 0:
            out |= self.first
        if stage == stages - 1:
            out |= self.last
        if 0 < stage < stages - 1:
            out |= self.middle
        return out
