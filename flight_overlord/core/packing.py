"""Packing samples into one fixed-length sequence with per-sample position ids."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class PackedSequence:
    input_ids: np.ndarray     # int32 [sequence length]
    position_ids: np.ndarray  # int32 [sequence length], restart at every sample, 0 on padding
    cu_seqlens: np.ndarray    # int32 [num_samples + 1]
    num_tokens: int           # real tokens, the rest is padding


def pack(samples: list[np.ndarray], context_length: int, pad_token_id: int = 0,
         pad_to_multiple: int | None = None) -> PackedSequence:
    """Samples back to back, padded to ``context_length`` or, with ``pad_to_multiple``, only up to
    the next multiple of it (at least one multiple, at most the context length)."""
    lengths = np.array([len(s) for s in samples], dtype=np.int32)
    total = int(lengths.sum())
    if total > context_length:
        raise ValueError(f"samples hold {total} tokens, more than the context length {context_length}")
    length = context_length
    if pad_to_multiple:
        length = min(context_length, max(1, -(-total // pad_to_multiple)) * pad_to_multiple)
    input_ids = np.full(length, pad_token_id, dtype=np.int32)
    if samples:
        input_ids[:total] = np.concatenate(samples)
    cu_seqlens = np.zeros(len(samples) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu_seqlens[1:])
    position_ids = np.zeros(length, dtype=np.int32)
    position_ids[:total] = np.arange(total, dtype=np.int32) - np.repeat(cu_seqlens[:-1], lengths)
    return PackedSequence(input_ids, position_ids, cu_seqlens, total)


def shifted_labels(input_ids: np.ndarray, cu_seqlens: np.ndarray, image_token_id: int | None) -> np.ndarray:
    """Next-token targets for a packed sequence: ``labels[i]`` is token i+1 of the same sample, and
    -100 (ignored) at each sample's last token, on padding and where the target is an image
    placeholder (the model does not predict image tokens)."""
    labels = np.full(len(input_ids), -100, dtype=np.int32)
    end = int(cu_seqlens[-1])
    if end == 0:
        return labels
    labels[:end - 1] = input_ids[1:end]
    labels[np.asarray(cu_seqlens[1:], dtype=np.int64) - 1] = -100
    if image_token_id is not None:
        labels[labels == image_token_id] = -100
    return labels
