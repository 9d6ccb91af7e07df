"""A rank's table under ``distribute("HDP")`` (schema ``schemas/hdp_microbatch.json``), no I/O.

Each sequence a rank holds is packed on its own as one THD sequence of its CP group (padded to a
multiple of 2g, labelled on the whole sequence) and the rank keeps its chunks r and 2g-1-r
(``core.context_parallel.token_ranges``, load-balanced split); a sequence held whole is kept as is.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..config import Config
from ..core.context_parallel import take_ranges, token_ranges
from ..core.mesh import Delivery
from ..core.packing import pack
from ..wire.schemas import HDP_MICROBATCH, list_array, load_schema
from .assembly import Sample, labels_of


def shard(sample: Sample, size: int, rank: int, pad_token_id: int):
    """(ids, positions, labels, [s0, e0, s1, e1], padded length) of CP rank ``rank`` of a group of
    ``size`` for one sequence."""
    tokens = sample.tokens
    slot = len(tokens) if size == 1 else -(-len(tokens) // (2 * size)) * (2 * size)
    packed = pack([tokens], slot, pad_token_id, None, 2 * size if size > 1 else 1)
    labels = labels_of(packed, [sample], None)
    if size == 1:
        ranges = [0, slot, slot, slot]
    else:
        ranges = token_ranges(slot, size, rank, "load_balanced")
    return (take_ranges(packed.input_ids, ranges), take_ranges(packed.position_ids, ranges),
            take_ranges(labels, ranges), ranges, slot)


def hdp_rank_table(step: int, bucket: int, microbatches: list[list[tuple[Sample, int, int]]],
                   delivery: Delivery, cfg: Config) -> pa.Table:
    """One rank's microbatches: per microbatch, its (sample, group size, first rank) entries in order."""
    rows = {k: [] for k in ("ids", "pos", "labels", "mask", "keys", "size", "rank", "first", "ranges", "cu", "cu_pad",
                            "cu_local", "real")}
    for entries in microbatches:
        parts = _whole(entries)  # sequences this rank holds whole: one pack for all of them
        parts = [parts.get(k) or shard(s, size, bucket - first, cfg.pad_token_id)
                 for k, (s, size, first) in enumerate(entries)]
        lengths = [len(s.tokens) for s, _, _ in entries]
        kept = [len(p[0]) for p in parts]
        labels = _cat([p[2] for p in parts]) if delivery.tokens else _empty()
        rows["ids"].append(_cat([p[0] for p in parts]) if "input_ids" in delivery.fields else _empty())
        rows["pos"].append(_cat([p[1] for p in parts]) if "position_ids" in delivery.fields else _empty())
        rows["labels"].append(labels if "labels" in delivery.fields else _empty())
        rows["mask"].append((labels != -100) if "loss_mask" in delivery.fields else _empty())
        rows["keys"].append([s.key for s, _, _ in entries])
        rows["size"].append(np.array([size for _, size, _ in entries], np.int32))
        rows["rank"].append(np.array([bucket - first for _, _, first in entries], np.int32))
        rows["first"].append(np.array([first for _, _, first in entries], np.int32))
        rows["ranges"].append(np.array([x for p in parts for x in p[3]], np.int32) if delivery.tokens else _empty())
        rows["cu"].append(np.cumsum([0] + lengths).astype(np.int32))
        rows["cu_pad"].append(np.cumsum([0] + [p[4] for p in parts]).astype(np.int32))
        rows["cu_local"].append(np.cumsum([0] + (kept if delivery.tokens else [0] * len(parts))).astype(np.int32))
        rows["real"].append(sum(_real_kept(p[3], n) for p, n in zip(parts, lengths)))
    n = len(microbatches)
    return pa.table({
        "step": pa.array(np.full(n, step, dtype=np.int64)),
        "bucket": pa.array(np.full(n, bucket, dtype=np.int32)),
        "microbatch": pa.array(np.arange(n, dtype=np.int32)),
        "input_ids": list_array(rows["ids"]),
        "position_ids": list_array(rows["pos"]),
        "labels": list_array(rows["labels"]),
        "loss_mask": list_array(rows["mask"], pa.int8()),
        "sample_keys": pa.ListArray.from_arrays(
            pa.array(np.cumsum([0] + [len(k) for k in rows["keys"]], dtype=np.int32)),
            pa.array([k for keys in rows["keys"] for k in keys], pa.string())),
        "seq_cp_size": list_array(rows["size"]),
        "seq_cp_rank": list_array(rows["rank"]),
        "seq_cp_first": list_array(rows["first"]),
        "token_ranges": list_array(rows["ranges"]),
        "cu_seqlens": list_array(rows["cu"]),
        "cu_seqlens_padded": list_array(rows["cu_pad"]),
        "cu_local": list_array(rows["cu_local"]),
        "num_tokens": pa.array(np.array(rows["real"], dtype=np.int32)),
    }, schema=load_schema(HDP_MICROBATCH))


def _whole(entries) -> dict[int, tuple]:
    """``shard``'s answer for every entry held whole (group of 1), from one pack and one labelling
    of them back to back (most entries are short samples: this is the constructor's hot path)."""
    whole = [k for k, (_, size, _) in enumerate(entries) if size == 1]
    if not whole:
        return {}
    samples = [entries[k][0] for k in whole]
    packed = pack([s.tokens for s in samples], sum(len(s.tokens) for s in samples))
    labels = labels_of(packed, samples, None)
    cu = packed.cu_seqlens.tolist()
    return {k: (packed.input_ids[a:b], packed.position_ids[a:b], labels[a:b], [0, b - a, b - a, b - a], b - a)
            for k, a, b in zip(whole, cu[:-1], cu[1:])}


def _real_kept(ranges: list[int], length: int) -> int:
    """Real (unpadded) tokens among the positions ``ranges`` names in a sequence of ``length``."""
    return sum(max(0, min(e, length) - s) for s, e in zip(ranges[::2], ranges[1::2]))


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int32, copy=False) if parts else _empty()


def _empty() -> np.ndarray:
    return np.zeros(0, np.int32)
