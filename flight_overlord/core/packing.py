"""Packing samples into one fixed-length sequence with per-sample position ids, and their labels.

Each sample occupies a *slot*: its tokens, then (with ``seq_multiple`` > 1) padding up to the next
multiple, as TransformerEngine's THD layout for context parallelism wants (every sequence padded to a
multiple of 2 * cp, then split on its own). ``cu_seqlens`` counts real tokens; ``cu_seqlens_padded``
gives the slots' boundaries in the buffer (equal to ``cu_seqlens`` without per-sample padding). With
per-sample padding, padding after the last sample is one more, padding-only, slot: both arrays then
have ``num_samples + 2`` entries, the extra sequence having zero real tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class PackedSequence:
    input_ids: np.ndarray          # int32 [sequence length]
    position_ids: np.ndarray       # int32 [sequence length], restart at every sample, 0 on padding
    cu_seqlens: np.ndarray         # int32 [num_samples + 1, + 1 more for a tail padding slot]: cumulative real lengths
    cu_seqlens_padded: np.ndarray  # int32 [same]: slot boundaries in the buffer
    num_tokens: int                # real tokens, the rest is padding


def round_up(values, multiple: int):
    """``values`` rounded up to a multiple of ``multiple`` (arrays or ints)."""
    return -(-values // multiple) * multiple


def pack(samples: list[np.ndarray], context_length: int, pad_token_id: int = 0,
         pad_to_multiple: int | None = None, seq_multiple: int = 1) -> PackedSequence:
    """Samples back to back, each in a slot of a multiple of ``seq_multiple`` tokens; the buffer is
    padded to ``context_length`` or, with ``pad_to_multiple``, only up to the next multiple of it (at
    least one multiple, at most the context length). With per-sample padding the slots cover the
    buffer: the tail padding after the last sample is a slot of its own with no real token
    (``cu_seqlens`` repeats its last value, ``cu_seqlens_padded`` ends at the buffer length), so
    under THD every real sequence, and the padding, is split evenly over the CP ranks. The buffer
    length must then be a multiple of ``seq_multiple`` (the config checks context_length and
    pad_to_multiple against 2*cp)."""
    lengths = np.array([len(s) for s in samples], dtype=np.int64)
    slots = round_up(lengths, seq_multiple)
    used = int(slots.sum())
    if used > context_length:
        raise ValueError(f"samples take {used} tokens, more than the context length {context_length}")
    length = context_length
    if pad_to_multiple:
        length = min(context_length, max(1, -(-used // pad_to_multiple)) * pad_to_multiple)
    cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    cu_padded = np.concatenate([[0], np.cumsum(slots)]).astype(np.int32)
    input_ids = np.full(length, pad_token_id, dtype=np.int32)
    position_ids = np.zeros(length, dtype=np.int32)
    if len(samples):
        where, within = _real_positions(cu_seqlens, cu_padded)
        input_ids[where] = np.concatenate(samples)
        position_ids[where] = within
    if seq_multiple > 1 and length % seq_multiple:
        raise ValueError(f"sequence length {length} is not a multiple of {seq_multiple}, the slot size "
                         f"multiple (THD context parallelism: context_length and pad_to_multiple must be "
                         f"multiples of 2*cp)")
    if seq_multiple > 1 and length > used:  # the tail padding: a slot of its own, with no real token
        cu_seqlens = np.append(cu_seqlens, cu_seqlens[-1]).astype(np.int32)
        cu_padded = np.append(cu_padded, length).astype(np.int32)
    return PackedSequence(input_ids, position_ids, cu_seqlens, cu_padded, int(lengths.sum()))


def _real_positions(cu_seqlens: np.ndarray, cu_seqlens_padded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(buffer position, position within its sample) of every real token, in order: whole-array
    numpy, as this runs for every microbatch the constructors pack."""
    lengths = np.diff(cu_seqlens).astype(np.int64)
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(cu_seqlens[:-1].astype(np.int64), lengths)
    return within + np.repeat(cu_seqlens_padded[:-1].astype(np.int64), lengths), within


def shifted_labels(packed: PackedSequence, image_token_id: int | None) -> np.ndarray:
    """Next-token targets for a packed sequence: ``labels[i]`` is token i+1 of the same sample, and
    -100 (ignored) at each sample's last token, on padding and where the target is an image
    placeholder (the model does not predict image tokens)."""
    ids = packed.input_ids
    labels = np.full(len(ids), -100, dtype=np.int32)
    where, within = _real_positions(packed.cu_seqlens, packed.cu_seqlens_padded)
    lengths = np.diff(packed.cu_seqlens)
    predicting = where[within < np.repeat(lengths, lengths) - 1]  # every real token but a sample's last
    labels[predicting] = ids[predicting + 1]
    if image_token_id is not None:
        labels[labels == image_token_id] = -100
    return labels


def mask_labels(labels: np.ndarray, packed: PackedSequence, masks: list[np.ndarray]) -> np.ndarray:
    """``labels`` with -100 wherever the target token's loss mask is 0 (supervised fine-tuning: prompt
    tokens are inputs, not targets); ``masks``: one 0/1 array per packed sample, as long as its tokens.
    ``labels[i]`` predicts token i+1, so it is kept only where that token's mask is 1."""
    trained = np.zeros(len(labels), dtype=bool)
    if masks:
        where, _ = _real_positions(packed.cu_seqlens, packed.cu_seqlens_padded)
        trained[where] = np.concatenate(masks).astype(bool)
    out = labels.copy()
    out[:-1][~trained[1:]] = -100
    return out
