"""Image-text corpora with the OVERLORD paper's heterogeneity: many sources, each its own shape.

``overlord make-demo-data --navit N`` writes N sources ``navit000`` .. (default 306, the paper's
``navit_data``); ``--coyo`` writes 5 sources ``coyo0`` .. ``coyo4`` (the paper's ``coyo700m``:
single image-caption pairs). Both use the interleaved layout of ``demo_images`` (``texts:
list<string>``, ``images: list<binary>``, one of them set at each position, plus ``doc_id``).

Nothing here is real data; what matters, and what the tests check, is the distributions.

navit (per source, drawn from ``default_rng([seed, 12_000, N])``; ``navit_profiles`` lists them):

==============  =====  ==================  ======================  =================================
kind            share  images per sample   long side (px)          text
==============  =====  ==================  ======================  =================================
``caption``     55 %   1                   log-normal, median      one caption, log-normal median
                                           160..800, sigma          8..48 bytes, sigma 0.5..0.9
                                           0.3..0.8
``interleaved`` 30 %   1 + Poisson(1..5)   median 200..900         paragraphs (one more than the
                                                                   images), median 40..400 bytes
``document``    15 %   1 + Poisson(0.5)    median 800..2400        one text, median 100..1500 bytes
==============  =====  ==================  ======================  =================================

Aspect ratios are log-normal (sigma 0.35, capped at 4:1). Sides are clipped to [32, 4096] and rounded
to multiples of 8 (the planner rounds to 28 anyway). So patch counts are heavy-tailed twice over:
across the sources and within each. Under Qwen2-VL's geometry (14 px patches, at most 5120
patches an image), per image: caption sources p50 ~420 patches, interleaved ~960, document ~4900
(a quarter at the cap); over the whole mixture p50 ~1000, p90 ~5000. The smallest source median is
over 20x below the largest.

coyo: every source holds single-image caption pairs; captions log-normal with median 14 bytes and
sigma 0.73 (about 98 % at most 64 bytes, and the longer ~2 % hold ~9 % of the text, as the paper
reports for coyo700m), images log-normal long side with median 384..512 px, sigma 0.45.

Text is random lowercase words: a caption of L bytes is L tokens under the ``byte_tokenizer``.

Images are small on disk: each is a valid 1-bit greyscale PNG of the drawn size, all black
(~100..500 bytes whatever the size). Its header gives the planner the real size and patch grid, and
it really decodes (a constructor decodes it as any PNG, at ~30 ms per megapixel here), but its
pixels carry nothing. A benchmark that must not spend 2 cores on decoding models the decode
instead (benchmarks/training/vlm_workload.py). Rows come from ``default_rng([seed, offset, source, row])``: the
files are byte-identical for the same arguments.
"""
from __future__ import annotations

import functools
import math
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from .data import MIN_FILES, MIN_ROW_GROUPS, MIN_ROWS_PER_GROUP, check_arguments, write_source

NAVIT_SEED_OFFSET, COYO_SEED_OFFSET = 12_000, 13_000
NAVIT_SOURCES, COYO_SOURCES = 306, 5
KINDS = ("caption", "interleaved", "document")
KIND_SHARES = (0.55, 0.30, 0.15)
MIN_SIDE, MAX_SIDE, SIDE_STEP = 32, 4096, 8
MAX_ASPECT = 4.0
_WORDS = np.array("the a of image photo shows red blue green small large river city street person dog "
                  "cat table chart diagram page text sign window tree sky light dark view near over "
                  "under with and two three many building car road field water mountain figure "
                  "document screen menu label number".split())


@dataclass(frozen=True)
class SourceProfile:
    """One source's distributions: every sample of the source is drawn from them."""
    name: str
    kind: str                 # caption | interleaved | document
    extra_images: float       # images per sample = 1 + Poisson(extra_images) (0: exactly one)
    side_median: float        # long side in px: log-normal with this median ...
    side_sigma: float         # ... and this sigma
    text_median: float        # bytes per text segment: log-normal with this median ...
    text_sigma: float         # ... and this sigma


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def navit_profiles(n_sources: int = NAVIT_SOURCES, *, seed: int = 0) -> list[SourceProfile]:
    """The N navit-like sources' distributions (see the module docstring), deterministic from the seed."""
    if isinstance(n_sources, bool) or not isinstance(n_sources, (int, np.integer)) or n_sources < 1:
        raise ValueError(f"the number of navit sources must be a positive integer, got {n_sources!r}")
    check_arguments(seed, 1.0)
    rng = np.random.default_rng([int(seed), NAVIT_SEED_OFFSET, int(n_sources)])
    width = max(3, len(str(n_sources - 1)))
    out = []
    for i in range(n_sources):
        kind = KINDS[int(rng.choice(len(KINDS), p=KIND_SHARES))]
        if kind == "caption":
            shape = (0.0, _log_uniform(rng, 160, 800), rng.uniform(0.3, 0.8), _log_uniform(rng, 8, 48),
                     rng.uniform(0.5, 0.9))
        elif kind == "interleaved":
            shape = (rng.uniform(1, 5), _log_uniform(rng, 200, 900), rng.uniform(0.3, 0.8),
                     _log_uniform(rng, 40, 400), 0.8)
        else:
            shape = (0.5, _log_uniform(rng, 800, 2400), rng.uniform(0.3, 0.6), _log_uniform(rng, 100, 1500), 0.7)
        out.append(SourceProfile(f"navit{i:0{width}d}", kind, *(float(x) for x in shape)))
    return out


def coyo_profiles(*, seed: int = 0) -> list[SourceProfile]:
    """The 5 coyo-like sources: single image-caption pairs, slightly different image sizes."""
    check_arguments(seed, 1.0)
    rng = np.random.default_rng([int(seed), COYO_SEED_OFFSET])
    return [SourceProfile(f"coyo{i}", "caption", 0.0, _log_uniform(rng, 384, 512), 0.45, 14.0, 0.73)
            for i in range(COYO_SOURCES)]


def sample_layout(profile: SourceProfile, rng: np.random.Generator) -> list[tuple[str, object]]:
    """One sample: its segments in order, ``("text", n_bytes)`` or ``("image", (width, height))``."""
    n_images = 1 + (int(rng.poisson(profile.extra_images)) if profile.extra_images else 0)
    images = [("image", _image_size(profile, rng)) for _ in range(n_images)]
    if profile.kind == "interleaved":
        texts = [("text", _text_bytes(profile, rng)) for _ in range(n_images + 1)]
        order = rng.permutation(len(images) + len(texts))
        segments = images + texts
        return [segments[i] for i in order]
    return images + [("text", _text_bytes(profile, rng))]


def _image_size(profile: SourceProfile, rng: np.random.Generator) -> tuple[int, int]:
    long_side = profile.side_median * math.exp(rng.normal(0, profile.side_sigma))
    aspect = min(MAX_ASPECT, math.exp(abs(rng.normal(0, 0.35))))
    sides = [long_side, long_side / aspect]
    w, h = (int(min(MAX_SIDE, max(MIN_SIDE, round(s / SIDE_STEP) * SIDE_STEP))) for s in sides)
    return (w, h) if rng.random() < 0.6 else (h, w)


def _text_bytes(profile: SourceProfile, rng: np.random.Generator) -> int:
    return max(1, int(round(profile.text_median * math.exp(rng.normal(0, profile.text_sigma)))))


def source_layouts(profile: SourceProfile, rows: int, *, seed: int, offset: int, index: int) -> list[list]:
    """Every row's ``sample_layout`` for a source: row r from ``default_rng([seed, offset, index, r])``."""
    return [sample_layout(profile, np.random.default_rng([int(seed), offset, index, r])) for r in range(rows)]


@functools.lru_cache(maxsize=4096)
def blank_png(width: int, height: int) -> bytes:
    """A valid all-black 1-bit greyscale PNG of the given size: a real header, and pixels that
    decode, at ~1 bit per pixel before zlib squeezes the zeros to almost nothing."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    rows = bytes(height * (1 + (width + 7) // 8))  # each scanline: filter byte 0, then the packed bits
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b""))


def _words(rng: np.random.Generator, n_bytes: int) -> str:
    words = _WORDS[rng.integers(0, len(_WORDS), n_bytes // 3 + 2)]
    return " ".join(words)[:n_bytes]


def _table(layouts: list[list], rng: np.random.Generator) -> pa.Table:
    texts, images = [], []
    for layout in layouts:
        texts.append([_words(rng, v) if kind == "text" else None for kind, v in layout])
        images.append([blank_png(*v) if kind == "image" else None for kind, v in layout])
    return pa.table({"texts": pa.array(texts, pa.list_(pa.string())),
                     "images": pa.array(images, pa.list_(pa.binary()))})


def _write(out_dir: Path, profiles: list[SourceProfile], rows: int, files: int, seed: int,
           offset: int) -> dict[str, list[Path]]:
    minimum = files * MIN_ROW_GROUPS * MIN_ROWS_PER_GROUP
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < minimum:
        raise ValueError(f"rows per source must be an integer >= {minimum} ({files} files x {MIN_ROW_GROUPS} "
                         f"row groups x {MIN_ROWS_PER_GROUP} rows), got {rows!r}")
    result = {}
    for i, profile in enumerate(profiles):
        layouts = source_layouts(profile, rows, seed=seed, offset=offset, index=i)
        table = _table(layouts, np.random.default_rng([int(seed), offset, i, 1 << 31]))
        result[profile.name] = write_source(out_dir / profile.name, table, files)
    return result


def make_navit(out_dir: str | os.PathLike, n_sources: int = NAVIT_SOURCES, *, seed: int = 0,
               rows_per_source: int = 200, files: int = MIN_FILES) -> dict[str, list[Path]]:
    """Write ``out_dir/navitNNN/part-NNNNN.parquet`` for ``navit_profiles(n_sources, seed=seed)``."""
    return _write(Path(out_dir), navit_profiles(n_sources, seed=seed), rows_per_source, files, seed,
                  NAVIT_SEED_OFFSET)


def make_coyo(out_dir: str | os.PathLike, *, seed: int = 0, rows_per_source: int = 2000,
              files: int = MIN_FILES) -> dict[str, list[Path]]:
    """Write ``out_dir/coyoN/part-NNNNN.parquet`` for the 5 ``coyo_profiles(seed=seed)``."""
    return _write(Path(out_dir), coyo_profiles(seed=seed), rows_per_source, files, seed, COYO_SEED_OFFSET)


def source_entries(profiles: list[SourceProfile]) -> list[dict]:
    """The config's ``sources`` for these profiles, equal weights (what configs/vlm_navit.yaml lists)."""
    return [{"name": p.name, "paths": f"{p.name}/*.parquet", "text_column": "texts", "image_column": "images",
             "weight": 1.0} for p in profiles]
