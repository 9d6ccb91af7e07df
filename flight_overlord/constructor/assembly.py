"""The constructor's transforms, as plain functions (no I/O):

1. decode (image-text samples, unless the loader already did): encoded images -> uint8 patches;
2. microbatch transforms: pack each microbatch into one sequence (padded to the capacity or to a
   multiple), next-token labels and a loss mask, pixel patches and a grid table per image;
3. parallelism transforms: each rank's table keeps the positions its delivery names (all, its
   context-parallel share, or none: metadata only).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..config import Config
from ..core.context_parallel import take_ranges, thd_token_ranges, token_ranges
from ..core.mesh import Delivery, Mesh
from ..core.packing import PackedSequence, mask_labels, pack, shifted_labels
from ..core.vision import ImageError, decode_sample_images, patches_from_bytes
from ..errors import OverlordError
from ..wire.schemas import ENCODER_BATCH, MICROBATCH, list_array, load_schema

log = logging.getLogger(__name__)


@dataclass
class Sample:
    """One fetched sample, after the decode stage."""
    key: str
    tokens: np.ndarray
    patches: np.ndarray | None = None  # uint8 [patches, 3*p*p] of the images in ``decoded``, in order
    grids: np.ndarray | None = None    # int32 flattened (t, h, w) per image (every image)
    decoded: tuple[int, ...] | None = None  # the images whose pixels are in ``patches``; None: all
    loss_mask: np.ndarray | None = None  # pre-tokenized with a loss-mask column: 0/1 per token


@dataclass
class Microbatch:
    packed: PackedSequence
    keys: list[str]
    labels: np.ndarray
    pixels: np.ndarray  # uint8, all images of the microbatch, flattened
    grids: np.ndarray   # int32, flattened (t, h, w) per image


@dataclass
class Failed:
    """A sample whose decode stage failed."""
    key: str
    message: str


class BadSample(OverlordError, RuntimeError):
    """A sample that cannot be delivered under ``vision.on_bad_image: fail``."""


def sample_loss_masks(masks: pa.ListArray, token_offsets: np.ndarray):
    """``j -> row j's loss mask`` (a view), or None where the loader sent none (its source has no
    loss-mask column: an empty list)."""
    offsets, values = masks.offsets.to_numpy(), masks.values.to_numpy()

    def of(j: int) -> np.ndarray | None:
        n = offsets[j + 1] - offsets[j]
        return values[offsets[j]:offsets[j + 1]] if n and n == token_offsets[j + 1] - token_offsets[j] else None
    return of


def decode_stage(key: str, tokens: np.ndarray, images: list[bytes], grids: list[int], cfg: Config,
                 ships: set[int] | None = None) -> Sample:
    """Pixels for a sample's images: decoded here (``decode_at: constructor``), or the loader's
    patch bytes viewed as an array. Raises ImageError naming what is wrong.

    ``ships``: the images whose pixels this constructor ships (an image graph's encoder rows;
    None: all). Only those are decoded; under ``vision.on_bad_image: skip`` the others are checked
    (``core.vision.check_image``: their data decoded, not resized), so that every constructor
    holding the sample drops it for a bad image exactly when the one decoding that image does."""
    if not images:
        return Sample(key, tokens)
    grids = np.asarray(grids, dtype=np.int32)
    if cfg.vision.decode_at == "loader":
        return Sample(key, tokens, patches_from_bytes(images, cfg.vision.spec), grids)
    only = None if ships is None else sorted(i for i in ships if 0 <= i < len(images))
    patches = decode_sample_images(images, grids.tolist(), cfg.vision.spec, only,
                                   check_others=cfg.vision.on_bad_image == "skip")
    return Sample(key, tokens, patches, grids, None if only is None else tuple(only))


def truncate(sample: Sample, length: int, cfg: Config) -> Sample:
    """Cut a sample to the length the plan gave it (a CP-axis capacity can be below the loader's
    limit) without splitting an image's run: an image that would be cut is dropped whole, with
    its pixels and everything after it."""
    if len(sample.tokens) <= length:
        return sample
    if sample.grids is None:
        return Sample(sample.key, sample.tokens[:length],
                      loss_mask=None if sample.loss_mask is None else sample.loss_mask[:length])
    starts = np.flatnonzero(sample.tokens == cfg.vision.vision_start_id)
    ends = np.flatnonzero(sample.tokens == cfg.vision.vision_end_id)
    whole = int(np.sum(ends < length))  # images whose run ends inside the cut
    cut = length if whole == len(starts) or starts[whole] >= length else int(starts[whole])
    triples = sample.grids.reshape(-1, 3)[:whole]
    decoded = None if sample.decoded is None else tuple(i for i in sample.decoded if i < whole)
    rows = int(triples[list(range(whole) if decoded is None else decoded)].prod(axis=1).sum())
    return Sample(sample.key, sample.tokens[:cut], sample.patches[:rows], triples.reshape(-1), decoded)


def drop_bad(samples: dict[int, Sample | Failed], cfg: Config) -> tuple[dict[int, Sample], list[str]]:
    """Skip the samples whose decode failed (logged with their key, and counted) or stop the run."""
    good, bad = {}, []
    for i, s in samples.items():
        if isinstance(s, Sample):
            good[i] = s
            continue
        if cfg.vision.on_bad_image == "fail":
            raise BadSample(f"sample {s.key}: {s.message} (vision.on_bad_image: fail)")
        log.error("sample %s: %s; skipped from its microbatch (vision.on_bad_image: skip)", s.key, s.message)
        bad.append(s.key)
    return good, bad


def build_microbatch(items: list[Sample], capacity: int, cfg: Config, image_token_id: int | None,
                     seq_multiple: int = 1) -> Microbatch:
    """Microbatch transforms: pack (each sample in a slot of a multiple of ``seq_multiple``: 2*cp under
    THD context parallelism), label, and gather the samples' pixels and grids in order."""
    packed = pack([s.tokens for s in items], capacity, cfg.pad_token_id, cfg.global_batch.pad_to_multiple,
                  seq_multiple)
    images = [s for s in items if s.patches is not None]
    pixels = np.concatenate([s.patches.reshape(-1) for s in images]) if images else np.zeros(0, np.uint8)
    grids = np.concatenate([s.grids for s in images]) if images else np.zeros(0, np.int32)
    return Microbatch(packed, [s.key for s in items], labels_of(packed, items, image_token_id), pixels, grids)


def labels_of(packed: PackedSequence, items: list[Sample], image_token_id: int | None) -> np.ndarray:
    """Next-token labels of packed ``items``; where a sample has a loss mask, its untrained targets -100."""
    labels = shifted_labels(packed, image_token_id)
    if all(s.loss_mask is None for s in items):
        return labels
    return mask_labels(labels, packed, [np.ones(len(s.tokens), np.uint8) if s.loss_mask is None else s.loss_mask
                                        for s in items])


def delivery_ranges(delivery: Delivery, packed: PackedSequence, mesh: Mesh) -> list[int]:
    """The positions of a packed sequence that a rank with this delivery receives: all, none (metadata
    only), or its context-parallel share: chunks of every sequence (THD) or of the whole buffer (BSHD)."""
    if not delivery.tokens:
        return []
    if delivery.cp_rank is None:
        return [0, len(packed.input_ids)]
    if mesh.cp_format == "thd":
        return thd_token_ranges(packed.cu_seqlens_padded, mesh.cp, delivery.cp_rank)
    return token_ranges(len(packed.input_ids), mesh.cp, delivery.cp_rank, mesh.cp_split)


def image_patches(sample: Sample, image: int) -> tuple[np.ndarray, np.ndarray]:
    """One image of a sample: its patch rows and its (t, h, w) grid."""
    triples = sample.grids.reshape(-1, 3)
    sizes = triples.prod(axis=1)
    before = list(range(image)) if sample.decoded is None else [i for i in sample.decoded if i < image]
    if sample.decoded is not None and image not in sample.decoded:
        raise ValueError(f"sample {sample.key}: image {image} was not decoded here (decoded: {sample.decoded})")
    start = int(sizes[before].sum())
    return sample.patches[start:start + int(sizes[image])], triples[image]


def encoder_table(step: int, rows: list[tuple[Sample, int, int, int]]) -> pa.Table:
    """One encoder bucket's table (image graph): a row per image it encodes, with the owner (bucket,
    microbatch) whose sequence holds that image's placeholder tokens."""
    images = [image_patches(sample, image) for sample, image, _, _ in rows]
    return pa.table({
        "step": pa.array(np.full(len(rows), step, dtype=np.int64)),
        "sample_key": pa.array([r[0].key for r in rows], pa.string()),
        "image_index": pa.array([r[1] for r in rows], pa.int32()),
        "owner_bucket": pa.array([r[2] for r in rows], pa.int32()),
        "owner_microbatch": pa.array([r[3] for r in rows], pa.int32()),
        "pixel_values": list_array([patches.reshape(-1) for patches, _ in images], pa.uint8()),
        "image_grid_thw": list_array([grid for _, grid in images]),
    }, schema=load_schema(ENCODER_BATCH))


def rank_table(step: int, bucket: int, microbatches: list[Microbatch], delivery: Delivery, cfg: Config,
               with_pixels: bool = True) -> pa.Table:
    """One delivery's table: a row per microbatch, each token field the delivery names holding the
    positions of ``token_ranges`` (the others empty). Pixels go where the delivery names them, unless
    an image graph sends them to the encoder ranks instead (``with_pixels=False``)."""
    with_pixels = with_pixels and "pixel_values" in delivery.fields
    n = len(microbatches)
    ranges = [delivery_ranges(delivery, mb.packed, cfg.mesh) for mb in microbatches]

    def field(name: str, rows):
        return rows if name in delivery.fields else (values[:0] for values in rows)

    def kept(values: np.ndarray, r: list[int]) -> np.ndarray:
        return take_ranges(values, r) if r else values[:0]

    def flat(rows, value_type=pa.int32()):
        return list_array(list(rows), value_type)

    columns = {
        "step": pa.array(np.full(n, step, dtype=np.int64)),
        "bucket": pa.array(np.full(n, bucket, dtype=np.int32)),
        "microbatch": pa.array(np.arange(n, dtype=np.int32)),
        "input_ids": flat(field("input_ids", (kept(mb.packed.input_ids, r) for mb, r in zip(microbatches, ranges)))),
        "position_ids": flat(field("position_ids",
                                   (kept(mb.packed.position_ids, r) for mb, r in zip(microbatches, ranges)))),
        "labels": flat(field("labels", (kept(mb.labels, r) for mb, r in zip(microbatches, ranges)))),
        "loss_mask": flat(field("loss_mask", (kept(mb.labels, r) != -100 for mb, r in zip(microbatches, ranges))),
                          pa.int8()),
        "token_ranges": flat(np.array(r, dtype=np.int32) for r in ranges),
        "sequence_length": pa.array(np.array([len(mb.packed.input_ids) for mb in microbatches], dtype=np.int32)),
        "cu_seqlens": flat(mb.packed.cu_seqlens for mb in microbatches),
        "cu_seqlens_padded": flat(mb.packed.cu_seqlens_padded for mb in microbatches),
        "sample_keys": pa.ListArray.from_arrays(
            pa.array(np.cumsum([0] + [len(mb.keys) for mb in microbatches], dtype=np.int32)),
            pa.array([k for mb in microbatches for k in mb.keys], pa.string())),
        "num_tokens": pa.array(np.array([mb.packed.num_tokens for mb in microbatches], dtype=np.int32)),
        "pixel_values": flat((mb.pixels if with_pixels else mb.pixels[:0] for mb in microbatches), pa.uint8()),
        "image_grid_thw": flat(mb.grids for mb in microbatches),
    }
    return pa.table(columns, schema=load_schema(MICROBATCH))


def shipped_images(plan_encoder: dict[int, list[list[int]]] | None) -> dict[int, set[int]] | None:
    """Item index -> the images whose pixels this constructor ships, from its encoder rows
    ``[item, image, owner bucket, owner microbatch]``; None without an image graph (a sequence's
    constructor ships all its images' pixels then). Under an image graph the sequence's own
    constructor ships none: its microbatches carry grids and placeholders only."""
    if plan_encoder is None:
        return None
    out: dict[int, set[int]] = {}
    for rows in plan_encoder.values():
        for item, image, _, _ in rows:
            out.setdefault(item, set()).add(image)
    return out


def decode_or_error(key: str, tokens, images, grids, cfg: Config, ships: set[int] | None = None) -> Sample | Failed:
    try:
        return decode_stage(key, tokens, images, grids, cfg, ships)
    except ImageError as exc:
        return Failed(key, str(exc))
