"""The sample transform of image-text sources, run at the loader.

A row is interleaved segments (the OBELICS layout): ``texts[i]`` or ``images[i]`` is set at each
position. The sample transform tokenizes the text and replaces every image by a run of
``image_token_id`` placeholders, as many as the LLM tokens the encoder will produce for it
(patches / merge_size^2), wrapped in ``vision_start_id`` ... ``vision_end_id``. Only the image *header*
is read for that, so a loader stays light; decoding happens later, at the constructor by default
(compressed bytes cross the network, the paper's transformation reordering), or at the loader when
``vision.decode_at: loader``.

Truncation to ``max_tokens`` never splits an image's placeholder run: an image that does not fit
whole is dropped with everything after it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ..config import VisionConfig
from ..core.vision import ImageError, decode_patches, image_size, num_patches, patch_grid, placeholder_tokens
from . import Tokenize


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
    spec = cfg.spec
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
