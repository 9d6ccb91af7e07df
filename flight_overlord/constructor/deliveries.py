"""What a constructor actually served: one small record per (step, rank), for ``overlord audit``.

A record names the step, the rank, the plan's bucket the rank's table came from, the number of
sample keys in it and a digest of them (not the keys: the plan journal holds what each bucket was
planned to get, and the digest proves the served table was that). Records are appended, one line
each, to ``run_dir/deliveries/constructor-<index>.jsonl``; the Planner adds a line to
``segments.jsonl`` every time a run starts or resumes, so the audit can tell which deliveries a
resume rolled back.
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Iterable, Iterator

from ..journal import Journal, read_journal

DIRECTORY = "deliveries"
SEGMENTS = "segments.jsonl"


def keys_digest(keys: Iterable[str]) -> str:
    """Order-free: a constructor hook may reorder microbatches, the set of keys is what counts."""
    return hashlib.blake2b("\n".join(sorted(keys)).encode(), digest_size=12).hexdigest()


class DeliveryJournal:
    def __init__(self, run_dir: Path, index: int):
        self._journal = Journal(run_dir / DIRECTORY / f"constructor-{index}.jsonl")

    def served(self, step: int, rank: int, bucket: int, keys: list[str]) -> None:
        self._journal.append({"t": time.time(), "step": step, "rank": rank, "bucket": bucket,
                              "n": len(keys), "digest": keys_digest(keys)})

    def rewound(self, rank: int, first: int, served: int) -> None:
        """Rank ``rank``'s stream starts again at ``first``, at or before ``served``, the last step it was
        served: those steps are served again (a trainer restarted from a checkpoint, or steps lost in flight)."""
        self._journal.append({"t": time.time(), "rewind": rank, "step": first, "served": served})

    def close(self) -> None:
        self._journal.close()


def mark_segment(run_dir: Path, *, resume: bool) -> None:
    """A run starts (or resumes): deliveries before this line belong to an earlier segment."""
    journal = Journal(run_dir / DIRECTORY / SEGMENTS, fsync=True)
    journal.append({"t": time.time(), "resume": resume})
    journal.close()


def read_deliveries(run_dir: Path) -> tuple[list[float], list[dict], list[dict]]:
    """(segment start times, every delivery record, every rewind record) of a run."""
    directory = run_dir / DIRECTORY
    starts = [r["t"] for _, r in read_journal(directory / SEGMENTS)]
    records: list[dict] = []
    rewinds: list[dict] = []
    for path in sorted(directory.glob("constructor-*.jsonl")):
        for _, record in read_journal(path):
            (rewinds if "rewind" in record else records).append(record)
    return starts, records, sorted(rewinds, key=lambda r: r["t"])


def in_force(starts: list[float], records: list[dict]) -> Iterator[dict]:
    """The deliveries a trainer kept: a resume rolls back every delivery of an earlier segment at or
    after the step the resumed run first served; of what is left, the latest of each (step, rank)."""
    import bisect
    segment = [max(0, bisect.bisect_right(starts, r["t"]) - 1) for r in records]
    first: dict[int, int] = {}
    for seg, record in zip(segment, records):
        first[seg] = min(first.get(seg, record["step"]), record["step"])
    later_first: dict[int, float] = {}  # per segment: the earliest step any later segment served
    floor = float("inf")
    for seg in sorted(first, reverse=True):
        later_first[seg] = floor
        floor = min(floor, first[seg])
    latest: dict[tuple[int, int], dict] = {}
    for seg, record in zip(segment, records):
        if record["step"] >= later_first[seg]:
            continue  # rolled back by a resume
        key = (record["step"], record["rank"])
        if key not in latest or record["t"] >= latest[key]["t"]:
            latest[key] = {**record, "segment": seg}
    return iter(sorted(latest.values(), key=lambda r: (r["step"], r["rank"])))
