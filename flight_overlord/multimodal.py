"""Image-text samples: the sample transform (at the loader) and the decode stage (where configured).

A row is interleaved segments (the OBELICS layout): ``texts[i]`` or ``images[i]`` is set at each
position. The sample transform tokenizes the text and replaces every image by a run of
``image_token_id`` placeholders, as many as the LLM tokens the encoder will produce for it
(patches / merge_size^2), wrapped in ``vision_start_id`` ... ``vision_end_id``. Only the image *header* is read for that, so a loader stays light;
decoding happens later, at the constructor by default (compressed bytes cross the network, the
paper's transformation reordering), or at the loader when ``vision.decode_at: loader``.

Truncation to ``max_tokens`` never splits an image's placeholder run: an image that does not fit
whole is dropped with everything after it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from .config import VisionConfig
from .transforms import Tokenize
from .vision import ImageError, VisionSpec, decode_patches, image_size, num_patches, patch_grid, placeholder_tokens


def vision_spec(cfg: VisionConfig) -> VisionSpec:
    return VisionSpec(cfg.patch_size, cfg.merge_size, cfg.min_pixels, cfg.max_pixels)


@dataclass
class ImageTextRows:
    """A transformed row group of an image-text source (one entry per row)."""
    tokens: list[np.ndarray]
    images: list[list[bytes]]  # the images kept, encoded (or decoded patch bytes, when decoded here)
    grids: list[list[int]]     # flattened (t, h, w) per kept image
    patches: np.ndarray        # vision-encoder patches per row
    errors: dict[int, str] = field(default_factory=dict)  # row -> what is wrong (the row is not served)


def transform_rows(texts: pa.ListArray, images: pa.ListArray, tokenize: Tokenize, cfg: VisionConfig,
                   max_tokens: int, *, decode: bool = False) -> ImageTextRows:
    spec = vision_spec(cfg)
    flat_tokens = tokenize(texts.values, max_tokens)  # every text segment at once (vectorised)
    token_offsets = flat_tokens.offsets.to_numpy()
    token_values = flat_tokens.values.to_numpy()
    seg_offsets = texts.offsets.to_numpy()
    image_values = images.values
    out = ImageTextRows([], [], [], np.zeros(len(texts), dtype=np.int64))
    for row in range(len(texts)):
        parts, kept, grids, used = [], [], [], 0
        try:
            for seg in range(seg_offsets[row], seg_offsets[row + 1]):
                image = image_values[seg]
                if image.is_valid:
                    data = image.as_py()
                    grid = patch_grid(*image_size(data), spec)
                    run = placeholder_tokens(grid, spec)
                    if used + run + 2 > max_tokens:
                        break  # never split an image's placeholder run
                    kept.append(decode_patches(data, spec)[0].tobytes() if decode else data)
                    grids.extend(grid)
                    parts.append(np.concatenate([[cfg.vision_start_id], np.full(run, cfg.image_token_id),
                                                 [cfg.vision_end_id]]).astype(np.int32))
                    out.patches[row] += num_patches(grid)
                    used += run + 2
                else:
                    text = token_values[token_offsets[seg]:token_offsets[seg + 1]][:max_tokens - used]
                    parts.append(text)
                    used += len(text)
                if used >= max_tokens:
                    break
        except ImageError as exc:
            out.errors[row] = f"image {len(kept)}: {exc}"
            parts, kept, grids, out.patches[row] = [], [], [], 0
        out.tokens.append(np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32))
        out.images.append(kept)
        out.grids.append(grids)
    return out


def decode_sample_images(images: list[bytes], grids: list[int], cfg: VisionConfig) -> np.ndarray:
    """The constructor's decode stage: a sample's images -> uint8 patches [sum of patches, 3*p*p].
    The grids were budgeted from the headers; a decode that disagrees is an error, not a silent
    change of the sample's length."""
    spec = vision_spec(cfg)
    out = []
    for i, data in enumerate(images):
        patches, grid = decode_patches(data, spec)
        if list(grid) != list(grids[3 * i:3 * i + 3]):
            raise ImageError(f"image {i}: decodes to grid {grid}, its header gave {grids[3 * i:3 * i + 3]}")
        out.append(patches)
    return np.concatenate(out) if out else np.zeros((0, 3 * spec.patch_size ** 2), np.uint8)


def patches_from_bytes(images: list[bytes], cfg: VisionConfig) -> np.ndarray:
    """Patches decoded at the loader travel as raw bytes: view them back as [n, 3*p*p] uint8."""
    dim = 3 * cfg.patch_size ** 2
    if not images:
        return np.zeros((0, dim), np.uint8)
    return np.frombuffer(b"".join(images), dtype=np.uint8).reshape(-1, dim)


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
