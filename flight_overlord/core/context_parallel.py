"""Context-parallel splits of one packed sequence across the CP ranks.

- ``contiguous``: rank c holds tokens [c*L/cp, (c+1)*L/cp).
- ``load_balanced``: the sequence is cut into 2*cp chunks and rank c holds chunks c and 2*cp-1-c.
  Under causal attention a token's work grows with its position, so pairing an early chunk with a
  late one gives every rank the same attention work (Megatron-LM / TransformerEngine's split).

A rank's share is described by ``[start0, end0, start1, end1, ...]`` positions in the full sequence,
delivered alongside the tokens, so the trainer (and the tests) can put the pieces back together.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .registry import Registry


@dataclass(frozen=True)
class CPSplit:
    """A split of a sequence into ``chunks_per_rank * cp`` equal chunks; ``picks(cp, rank)`` are a rank's."""
    chunks_per_rank: int
    picks: Callable[[int, int], list[int]]


CP_SPLITS: Registry = Registry("context-parallel split")


def register_cp_split(name: str, split: CPSplit) -> CPSplit:
    """Make ``split`` available as ``mesh.cp_split: name``."""
    return CP_SPLITS.register(name)(split)


register_cp_split("load_balanced", CPSplit(2, lambda cp, rank: [rank, 2 * cp - 1 - rank]))
register_cp_split("contiguous", CPSplit(1, lambda cp, rank: [rank]))


def cp_split(mode: str) -> CPSplit:
    return CP_SPLITS[mode]


def chunk_count(cp: int, mode: str) -> int:
    return cp_split(mode).chunks_per_rank * cp


def token_ranges(length: int, cp: int, cp_rank: int, mode: str) -> list[int]:
    """Flat [start, end, ...] of the positions rank ``cp_rank`` holds; ``length`` must divide evenly."""
    chunks = chunk_count(cp, mode)
    if length % chunks:
        raise ValueError(f"sequence length {length} is not divisible into {chunks} chunks ({mode} split, cp={cp})")
    if not 0 <= cp_rank < cp:
        raise ValueError(f"cp rank {cp_rank} outside 0..{cp - 1}")
    size = length // chunks
    picks = cp_split(mode).picks(cp, cp_rank)
    return [p for c in picks for p in (c * size, (c + 1) * size)]


CP_FORMATS = ("thd", "bshd")  # thd: each packed sequence split on its own; bshd: the whole buffer split


def thd_token_ranges(cu_seqlens_padded, cp: int, cp_rank: int) -> list[int]:
    """TransformerEngine's THD split: every sequence (slot) is cut into 2*cp chunks and rank c holds
    chunks c and 2*cp-1-c of each, in sequence order; flat [start, end, ...] in the full buffer,
    adjacent ranges merged."""
    if not 0 <= cp_rank < cp:
        raise ValueError(f"cp rank {cp_rank} outside 0..{cp - 1}")
    ranges: list[int] = []
    for start, end in zip(cu_seqlens_padded[:-1], cu_seqlens_padded[1:]):
        start, end = int(start), int(end)
        if (end - start) % (2 * cp):
            raise ValueError(f"sequence slot [{start}, {end}) is not a multiple of 2*cp = {2 * cp}")
        chunk = (end - start) // (2 * cp)
        for c in (cp_rank, 2 * cp - 1 - cp_rank):
            lo, hi = start + c * chunk, start + (c + 1) * chunk
            if hi == lo:
                continue
            if ranges and ranges[-1] == lo:
                ranges[-1] = hi
            else:
                ranges += [lo, hi]
    return ranges


def take_ranges(values: np.ndarray, ranges: list[int]) -> np.ndarray:
    """The positions named by ``ranges``, concatenated in order (a view when there is one range)."""
    parts = [values[ranges[i]:ranges[i + 1]] for i in range(0, len(ranges), 2)]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def reassemble(pieces: list[tuple[np.ndarray, list[int]]], length: int) -> np.ndarray:
    """Inverse of the split: put each rank's tokens back at their positions."""
    out = np.zeros(length, dtype=pieces[0][0].dtype if pieces else np.int32)
    for values, ranges in pieces:
        at = 0
        for i in range(0, len(ranges), 2):
            n = ranges[i + 1] - ranges[i]
            out[ranges[i]:ranges[i + 1]] = values[at:at + n]
            at += n
    return out
