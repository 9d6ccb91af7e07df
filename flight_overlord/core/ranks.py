"""Sets of trainer ranks as an operator writes them: ``0-7``, ``8``, ``0-3,16-19``."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankSet:
    """Inclusive spans of ranks, e.g. ``RankSet.parse("0-7,12")``; ``rank in ranks``."""
    spans: tuple[tuple[int, int], ...]

    @classmethod
    def parse(cls, text: str) -> "RankSet":
        """``"0-7,12"``; a ValueError names the part that is not a rank or a ``first-last`` span."""
        spans = []
        for part in text.split(","):
            first, dash, last = part.strip().partition("-")
            try:
                span = (int(first), int(last) if dash else int(first))
            except ValueError:
                raise ValueError(f"{part.strip()!r} is not a rank or a span FIRST-LAST of ranks "
                                 "(e.g. 0-7,12)") from None
            if span[0] < 0 or span[1] < span[0]:
                raise ValueError(f"{part.strip()!r}: ranks are >= 0 and a span goes from low to high")
            spans.append(span)
        return cls(tuple(sorted(spans)))

    def __contains__(self, rank: object) -> bool:
        return (isinstance(rank, int) and not isinstance(rank, bool)
                and any(first <= rank <= last for first, last in self.spans))

    @property
    def last(self) -> int:
        return max(last for _, last in self.spans)

    def __str__(self) -> str:
        return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in self.spans)
