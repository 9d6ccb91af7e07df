"""Image-text demo sources: synthetic pictures really encoded with Pillow, deterministic from the seed.

Both sources use the OBELICS/MINT interleaved layout. A row holds ``texts: list<string>`` and
``images: list<binary>`` of the same length, and position i is either a text segment
(``images[i]`` null) or an encoded image (``texts[i]`` null). There is also ``doc_id: int64``.

===============  =========  ====================================================================
source           rows @1.0  content
===============  =========  ====================================================================
``imagecaps``     6 000     one image then its caption. Image sides are mostly 32..160 px, with a
                            long tail up to 1400 px. ~80 % JPEG "photos", ~20 % PNG "diagrams".
``interleaved``     800     2..6 images and 2..8 paragraphs (100..1500 B) in random order. Images
                            are mostly mid-size (200..700 px), 48..1400 px overall.
===============  =========  ====================================================================

The pictures are made to be cheap to draw and to compress like real ones. A "photo" is a smooth
two-colour background (a small random colour grid, upscaled bicubically) with a few filled
shapes and sometimes a word, saved as JPEG (quality 70..95, some progressive, ~5 % greyscale).
A "diagram" is flat colour with outlined shapes and labels, saved as PNG (some RGBA with a
transparent background). Pure noise would be neither: it barely compresses. Captions describe
what was drawn ("two red circles and a blue square on a green and orange background").

Every row is drawn from its own generator, ``default_rng([seed, source, row])``. The output is
byte-identical for the same seed and scale with the same Pillow/libjpeg/zlib build. Paragraphs
come from ``demo_data``'s text material.
"""
from __future__ import annotations

import functools
import io
import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
from PIL import Image, ImageChops, ImageDraw, ImageFont, features

from .layout import check_arguments, layout, write_source
from .material import gather_material
from .text import cut, fill, log_uniform

IMAGE_SOURCE_NAMES: tuple[str, ...] = ("imagecaps", "interleaved")

_ROWS_AT_SCALE_1 = {"imagecaps": 6_000, "interleaved": 800}
_SEED_OFFSET = {"imagecaps": 7_000, "interleaved": 8_000}

# Long side in pixels: (probability, low, high), log-uniform within a tier.
_CAPTION_SIZES = ((0.75, 32, 160), (0.20, 160, 600), (0.05, 600, 1400))
_INTERLEAVED_SIZES = ((0.40, 48, 200), (0.45, 200, 700), (0.15, 700, 1400))

_PALETTE = (("red", (205, 45, 45)), ("orange", (240, 140, 30)), ("yellow", (235, 215, 60)),
            ("green", (60, 160, 70)), ("teal", (30, 140, 140)), ("blue", (45, 90, 200)),
            ("purple", (130, 60, 170)), ("pink", (235, 130, 180)), ("brown", (120, 80, 40)),
            ("black", (25, 25, 25)), ("grey", (128, 128, 128)), ("white", (245, 245, 245)))
_SHAPES = ("circle", "square", "triangle", "rectangle", "ring", "stripe")
_WORDS = ("arrow", "batch", "token", "flight", "shard", "stream", "route", "plan", "mesh", "sample",
          "open", "exit", "north", "cafe", "sale", "stop", "data", "home", "river", "garden")
_NUMBERS = ("a", "two", "three", "four", "five", "six")


def _colour(rng: np.random.Generator) -> tuple[str, tuple[int, int, int]]:
    return _PALETTE[int(rng.integers(len(_PALETTE)))]


def _picture_size(rng: np.random.Generator, tiers: tuple) -> tuple[int, int]:
    """(width, height): the long side from ``tiers``, the aspect ratio mostly within 2.5:1, rarely 6:1."""
    probs, lows, highs = zip(*tiers)
    tier = int(rng.choice(len(tiers), p=probs))
    long_side = log_uniform(rng, lows[tier], highs[tier])
    aspect = math.exp(rng.uniform(0, math.log(6 if rng.random() < 0.05 else 2.5)))
    short_side = max(8, round(long_side / aspect))
    return (long_side, short_side) if rng.random() < 0.6 else (short_side, long_side)


@functools.lru_cache(maxsize=32)
def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    return ImageFont.load_default(size) if features.check("freetype2") else ImageFont.load_default()


def _draw_shapes(rng: np.random.Generator, im: Image.Image, n: int, outline: bool) -> list[tuple[str, str]]:
    """Draw ``n`` random shapes; return their (colour name, shape) pairs."""
    draw = ImageDraw.Draw(im)
    w, h = im.size
    drawn = []
    for _ in range(n):
        name, rgb = _colour(rng)
        kind = _SHAPES[int(rng.integers(len(_SHAPES)))]
        size = max(2, int(min(w, h) * rng.uniform(0.15, 0.6)))
        x0, y0 = int(rng.integers(-size // 4, w - size // 2)), int(rng.integers(-size // 4, h - size // 2))
        box = (x0, y0, x0 + size, y0 + size)
        edge = dict(outline=(20, 20, 20), width=max(1, size // 25)) if outline else {}
        if kind == "circle":
            draw.ellipse(box, fill=rgb, **edge)
        elif kind == "square":
            draw.rectangle(box, fill=rgb, **edge)
        elif kind == "rectangle":
            draw.rectangle((x0, y0, x0 + size, y0 + max(1, size // 2)), fill=rgb, **edge)
        elif kind == "triangle":
            draw.polygon([(x0 + size // 2, y0), (x0 + size, y0 + size), (x0, y0 + size)], fill=rgb, **edge)
        elif kind == "ring":
            draw.ellipse(box, outline=rgb, width=max(1, size // 8))
        else:
            draw.line((x0, y0, x0 + size, y0 + size // 3), fill=rgb, width=max(1, size // 10))
        drawn.append((name, kind))
    return drawn


def _draw_word(rng: np.random.Generator, im: Image.Image) -> str | None:
    """Half the time write a word somewhere legible: real pictures often hold text (OCR-ish data)."""
    w, h = im.size
    if min(w, h) < 40 or rng.random() < 0.5:
        return None
    word = _WORDS[int(rng.integers(len(_WORDS)))]
    size = max(8, int(min(w, h) * rng.uniform(0.08, 0.25)))
    xy = (int(rng.integers(0, max(1, w - size * len(word) // 2))), int(rng.integers(0, max(1, h - size))))
    ImageDraw.Draw(im).text(xy, word, fill=_colour(rng)[1], font=_font(size))
    return word


def _add_grain(rng: np.random.Generator, im: Image.Image) -> Image.Image:
    """Fine grain (a tiled 64x64 noise patch, +-2..8 levels). Without it the smooth pictures
    compress to ~0.04 B/px, a fraction of a real photo's 0.1..0.3, and a loader benchmark on
    them would move unrealistically few bytes. Tiling one patch keeps the cost to a memory copy."""
    w, h = im.size
    amp = int(rng.integers(2, 9))
    tile = rng.integers(0, 2 * amp + 1, (64, 64, 1), dtype=np.uint8)
    grain = np.tile(tile, (-(-h // 64), -(-w // 64), 3))[:h, :w]
    return ImageChops.add(im, Image.fromarray(grain, "RGB"), offset=-amp)


def _describe(drawn: list[tuple[str, str]], colours: bool) -> str:
    """"two red circles and a blue square": the drawn shapes, grouped, most frequent first."""
    counts = Counter((colour if colours else "", kind) for colour, kind in drawn)
    parts = []
    for (colour, kind), k in counts.most_common(3):
        noun = kind if k == 1 else kind + "s"
        words = [w for w in (colour, noun) if w]
        number = _NUMBERS[min(k, len(_NUMBERS)) - 1]
        parts.append(" ".join([_article(words[0]) if number == "a" else number] + words))
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _photo(rng: np.random.Generator, size: tuple[int, int]) -> tuple[bytes, str]:
    """A JPEG: a smooth two-colour background with filled shapes; and a caption describing it."""
    (bg1, rgb1), (bg2, rgb2) = _colour(rng), _colour(rng)
    cells = int(rng.integers(2, 5))
    t = rng.random((cells, cells, 1))
    grid = np.array(rgb1) * (1 - t) + np.array(rgb2) * t + rng.normal(0, 12, (cells, cells, 3))
    im = Image.fromarray(np.clip(grid, 0, 255).astype(np.uint8), "RGB").resize(size, Image.Resampling.BICUBIC)
    drawn = _draw_shapes(rng, im, int(rng.integers(1, 6)), outline=False)
    word = _draw_word(rng, im)
    im = _add_grain(rng, im)
    if rng.random() < 0.05:
        im = im.convert("L")
        caption = "a black and white photo of " + _describe(drawn, colours=False)
    else:
        what = _describe(drawn, colours=True)
        background = bg1 if bg1 == bg2 else f"{bg1} and {bg2}"
        a = _article(background)
        caption = (f"{what} on {a} {background} background", f"a photo of {what}",
                   f"{what} against {a} {background} gradient", f"close-up of {what}")[int(rng.integers(4))]
    if word:
        caption += f' with the word "{word}"'
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=int(rng.integers(70, 96)), progressive=bool(rng.random() < 0.15))
    return buf.getvalue(), caption


def _diagram(rng: np.random.Generator, size: tuple[int, int]) -> tuple[bytes, str]:
    """A PNG: flat colours, outlined shapes, a label; a third have a transparent background."""
    transparent = rng.random() < 0.33
    light = tuple(int(v) for v in rng.integers(225, 256, 3))
    im = Image.new("RGBA" if transparent else "RGB", size, (0, 0, 0, 0) if transparent else light)
    drawn = _draw_shapes(rng, im, int(rng.integers(2, 7)), outline=True)
    word = _draw_word(rng, im)
    what = _describe(drawn, colours=True)
    caption = (f"a logo with {what}" if transparent else
               (f"a diagram of {what}", f"an illustration showing {what}", f"clip art: {what}")[int(rng.integers(3))])
    if word:
        caption += f' labelled "{word}"'
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue(), caption


def _picture(rng: np.random.Generator, tiers: tuple, p_photo: float) -> tuple[bytes, str]:
    size = _picture_size(rng, tiers)
    return _photo(rng, size) if rng.random() < p_photo else _diagram(rng, size)


def _gen_imagecaps(rngs: list[np.random.Generator]) -> pa.Table:
    texts, images = [], []
    for rng in rngs:
        image, caption = _picture(rng, _CAPTION_SIZES, p_photo=0.8)
        texts.append([None, caption])
        images.append([image, None])
    return _interleaved_table(texts, images)


def _gen_interleaved(rngs: list[np.random.Generator]) -> pa.Table:
    pool = gather_material().paragraphs
    texts, images = [], []
    for rng in rngs:
        is_image = rng.permutation([True] * int(rng.integers(2, 7)) + [False] * int(rng.integers(2, 9)))
        row_texts, row_images = [], []
        for image_here in is_image:
            if image_here:
                row_texts.append(None)
                row_images.append(_picture(rng, _INTERLEAVED_SIZES, p_photo=0.75)[0])
            else:
                target = log_uniform(rng, 100, 1500)
                row_texts.append(cut(fill(rng, pool, target + 1), target, 100))
                row_images.append(None)
        texts.append(row_texts)
        images.append(row_images)
    return _interleaved_table(texts, images)


def _interleaved_table(texts: list[list], images: list[list]) -> pa.Table:
    return pa.table({"texts": pa.array(texts, pa.list_(pa.string())),
                     "images": pa.array(images, pa.list_(pa.binary()))})


_GENERATORS = {"imagecaps": _gen_imagecaps, "interleaved": _gen_interleaved}


def make_image_demo_data(out_dir: str | os.PathLike, *, seed: int = 0, scale: float = 1.0) -> dict[str, list[Path]]:
    """Write out_dir/<source>/part-NNNNN.parquet for the image sources; return {source: [paths]}.

    Columns are ``texts`` (list<string>), ``images`` (list<binary>) and ``doc_id`` (int64, unique
    within a source). Files, row groups and the clamping at small scales are the same as for
    ``demo_data.make_demo_data``. Existing ``part-*.parquet`` files in the source directories are
    replaced.
    """
    check_arguments(seed, scale)
    result = {}
    for name in IMAGE_SOURCE_NAMES:
        rows, n_files = layout(_ROWS_AT_SCALE_1[name], scale)
        rngs = [np.random.default_rng([int(seed), _SEED_OFFSET[name], row]) for row in range(rows)]
        result[name] = write_source(Path(out_dir) / name, _GENERATORS[name](rngs), n_files)
    return result
