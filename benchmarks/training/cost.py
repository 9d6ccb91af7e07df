"""``training.end_to_end``'s cost model: seconds a real accelerator needs per microbatch (a dense 7B backbone,
a ViT encoder, context-parallel ring attention). Pure functions of a rank's microbatch rows."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TFLOPS, MFU = 400e12, 0.40
FLOPS = TFLOPS * MFU  # what the simulated accelerator sustains


@dataclass(frozen=True)
class ModelCost:
    """Training (forward + backward) time of a transformer on one accelerator: a * tokens + b * l^2
    per sequence of l tokens, from 6 * params FLOPs per token and 12 * layers * hidden per token pair."""
    name: str
    params: float
    layers: int
    hidden: int

    @property
    def a(self) -> float:
        return 6 * self.params / FLOPS

    @property
    def b(self) -> float:
        return 12 * self.layers * self.hidden / FLOPS

    def seconds(self, lengths: np.ndarray) -> float:
        lengths = np.asarray(lengths, dtype=np.float64)
        return float(self.a * lengths.sum() + self.b * (lengths ** 2).sum())

    def describe(self) -> str:
        return (f"{self.name}: a = 6*{self.params:.3g}/{FLOPS:.3g} = {self.a * 1e6:.1f} us/token, "
                f"b = 12*{self.layers}*{self.hidden}/{FLOPS:.3g} = {self.b * 1e9:.2f} ns/token^2 "
                f"(a 32K sequence: {self.seconds([32768]):.1f} s, "
                f"{self.b * 32768**2 / self.seconds([32768]):.0%} attention)")


LLM = ModelCost("Llama-2-7B backbone", 6.74e9, 32, 4096)
VIT = ModelCost("Qwen2-VL ViT", 6.75e8, 32, 1280)
KV_BYTES_PER_TOKEN = 2 * LLM.hidden * 2 * LLM.layers  # K and V, bf16, every layer (no GQA in Llama-2-7B)
CP_LINK_BYTES_PER_S = 100e9  # per rank, ring neighbour to neighbour
CP_PASSES = 3  # forward sends K,V around the ring; backward sends K,V and dK,dV


def sequence_lengths(mb: dict) -> np.ndarray:
    return np.diff(np.asarray(mb["cu_seqlens"], dtype=np.int64))


def backbone(mbs: list[dict], encoder_inputs=None) -> list[float]:
    """One entry per microbatch: the backbone over its packed sequences (image placeholders included)."""
    return [LLM.seconds(sequence_lengths(mb)) for mb in mbs]


def image_patches(grids) -> np.ndarray:
    return np.array([int(np.prod(g)) for grid in grids for g in np.asarray(grid).reshape(-1, 3)], dtype=np.int64)


def vlm_own_images(mbs: list[dict], encoder_inputs=None) -> list[float]:
    """Backbone per microbatch, each microbatch's images through the ViT on this rank first."""
    return [VIT.seconds(image_patches([mb["image_grid_thw"]])) + LLM.seconds(sequence_lengths(mb)) for mb in mbs]


def vlm_hybrid(mbs: list[dict], encoder_inputs: list[dict]) -> list[float]:
    """The ViT over the images the image graph gave this rank (one entry), then the backbone per
    microbatch. The embeddings' all-to-all back to the sequences' owners is not charged."""
    return [VIT.seconds(image_patches([e["image_grid_thw"] for e in encoder_inputs]))] + backbone(mbs)


def context_parallel(cp: int, mbs: list[dict], encoder_inputs=None) -> list[float]:
    """One CP rank's share of each microbatch: a * the real positions it holds, plus 2b * the causal
    (query, key) pairs of those query positions (so the cp ranks' pairs add up to b * l^2 per
    sequence), plus ring attention's exposed KV traffic: CP_PASSES * (cp - 1) * held tokens *
    KV_BYTES_PER_TOKEN / CP_LINK_BYTES_PER_S. Sequence i's real tokens are the first
    ``cu_seqlens[i+1] - cu_seqlens[i]`` positions of its slot in ``cu_seqlens_padded``; padding
    (within a slot, or the buffer's tail: under THD a padding-only slot of its own, zero real
    tokens) costs nothing, as for the other scenarios."""
    out = []
    for mb in mbs:
        starts = np.asarray(mb["cu_seqlens_padded"], dtype=np.int64)[:-1]
        ends = starts + sequence_lengths(mb)
        ranges = np.asarray(mb["token_ranges"], dtype=np.int64).reshape(-1, 2)
        held, pairs = 0, 0.0
        for lo, hi in ranges:
            for s in range(max(int(np.searchsorted(starts, lo, side="right")) - 1, 0), len(starts)):
                if starts[s] >= hi:
                    break
                x, y = max(lo, starts[s]), min(hi, ends[s])
                if y > x:  # positions x..y-1 of the sequence starting at starts[s]: each sees p - start + 1 keys
                    held += y - x
                    pairs += (y - x) * ((x + y - 1) / 2 - starts[s] + 1)
        comm = CP_PASSES * (cp - 1) * held * KV_BYTES_PER_TOKEN / CP_LINK_BYTES_PER_S
        out.append(LLM.a * held + 2 * LLM.b * pairs + comm)
    return out


def hdp_groups(mbs: list[dict], encoder_inputs=None) -> list[float]:
    """``distribute("HDP")`` rows (schemas/hdp_microbatch.json): every sequence on its own CP group of
    ``seq_cp_size`` ranks; per sequence, a * held positions + 2b * their causal pairs, plus ring
    attention's KV traffic CP_PASSES * (g-1) * held * KV_BYTES_PER_TOKEN / CP_LINK_BYTES_PER_S when
    g > 1. Optimistic: the step barrier is the only sync, while a real group also syncs its members
    inside the microbatch (benchmarks/balance/hdp.py models that)."""
    out = []
    for mb in mbs:
        ranges = np.asarray(mb["token_ranges"], dtype=np.int64).reshape(-1, 2, 2)  # per sequence, 2 chunks
        seconds = 0.0
        for g, chunks in zip(mb["seq_cp_size"], ranges):
            held = int((chunks[:, 1] - chunks[:, 0]).sum())
            pairs = float(((chunks[:, 1] - chunks[:, 0]) * ((chunks[:, 0] + chunks[:, 1] - 1) / 2 + 1)).sum())
            ring = CP_PASSES * (g - 1) * held * KV_BYTES_PER_TOKEN / CP_LINK_BYTES_PER_S
            seconds += LLM.a * held + 2 * LLM.b * pairs + ring
        out.append(seconds)
    return out

