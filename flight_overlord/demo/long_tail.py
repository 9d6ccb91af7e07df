"""A long-tail text source: most samples short, a few as long as the context, for balancing and
long-context benchmarks (``overlord make-demo-data --long-tail MAX_TOKENS``).

The text is synthetic: each row is a run of random lowercase letters and spaces, so under the
``byte_tokenizer`` a row of L bytes is exactly L tokens (synthetic token ids; nothing here is
language). Only the length distribution matters, and it is the point:

- body, a share ``1 - tail_fraction`` of the rows: log-normal with median ``body_median`` tokens
  and sigma ``body_sigma``, clipped to ``[min_tokens, max_tokens]``;
- tail, ``tail_fraction`` of the rows: log-uniform in ``[max_tokens / 16, max_tokens]``.

With the defaults (median 512, sigma 1, 4 % tail) at ``max_tokens=32768`` about 95 % of the
rows are under 4K tokens and the tail holds about a third of all tokens, roughly the shape of
long-context pretraining and SFT mixtures. ``max_tokens`` may be anything from 64 up (e.g.
256K for long-context runs); the body does not move with it, the tail does.

Lengths come from ``default_rng([seed, 11_000])`` and the letters from one further generator per
row group, so the files are byte-identical for the same arguments, and generating is vectorized
(about 100 MB of text per second).
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa

from .layout import MIN_FILES, MIN_ROW_GROUPS, MIN_ROWS_PER_GROUP, write_source

LONG_TAIL_SEED_OFFSET = 11_000
_ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz      ", dtype=np.uint8)  # ~1 space in 6


def long_tail_lengths(rows: int, max_tokens: int, *, seed: int = 0, min_tokens: int = 16,
                      body_median: int = 512, body_sigma: float = 1.0,
                      tail_fraction: float = 0.04) -> np.ndarray:
    """The token count of each of ``rows`` samples (int64), as the module docstring describes."""
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
        raise ValueError(f"rows must be a positive integer, got {rows!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) or max_tokens < 64:
        raise ValueError(f"max_tokens must be an integer >= 64, got {max_tokens!r}")
    if not 1 <= min_tokens <= max_tokens:
        raise ValueError(f"min_tokens must be in [1, max_tokens={max_tokens}], got {min_tokens!r}")
    if not 0.0 <= tail_fraction <= 1.0:
        raise ValueError(f"tail_fraction must be in [0, 1], got {tail_fraction!r}")
    if not body_median > 0 or not body_sigma >= 0:
        raise ValueError(f"body_median must be > 0 and body_sigma >= 0, got {body_median!r}, {body_sigma!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    rng = np.random.default_rng([int(seed), LONG_TAIL_SEED_OFFSET])
    body = np.exp(rng.normal(math.log(body_median), body_sigma, rows))
    tail = np.exp(rng.uniform(math.log(max_tokens / 16), math.log(max_tokens), rows))
    lengths = np.where(rng.random(rows) < tail_fraction, tail, body)
    return np.clip(np.rint(lengths), min_tokens, max_tokens).astype(np.int64)


def _synthetic_text(lengths: np.ndarray, rng: np.random.Generator) -> pa.StringArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = _ALPHABET[rng.integers(0, len(_ALPHABET), int(offsets[-1]), dtype=np.uint8)]
    return pa.LargeStringArray.from_buffers(len(lengths), pa.py_buffer(offsets), pa.py_buffer(data)).cast(pa.string())


def make_long_tail(out_dir: str | os.PathLike, name: str = "longtail", *, rows: int = 20_000,
                   max_tokens: int = 32768, seed: int = 0, files: int = 4, **shape) -> list[Path]:
    """Write ``out_dir/name/part-NNNNN.parquet`` (columns ``text``, ``doc_id``; several row groups
    per file) with ``rows`` samples of ``long_tail_lengths(rows, max_tokens, seed=seed, **shape)``
    tokens each under the ``byte_tokenizer``; return the paths. Deterministic from the arguments."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"name must be a plain directory name, got {name!r}")
    lengths = long_tail_lengths(rows, max_tokens, seed=seed, **shape)
    n_files = max(MIN_FILES, int(files))
    if rows < n_files * MIN_ROW_GROUPS * MIN_ROWS_PER_GROUP:
        minimum = n_files * MIN_ROW_GROUPS * MIN_ROWS_PER_GROUP
        raise ValueError(f"rows must be >= {minimum} for {n_files} files, got {rows}")
    chunks = np.array_split(np.arange(rows), 64)  # one letter generator per chunk: bounded memory
    text = pa.chunked_array([_synthetic_text(lengths[c], np.random.default_rng([int(seed), LONG_TAIL_SEED_OFFSET, i]))
                             for i, c in enumerate(chunks) if len(c)], pa.string())
    return write_source(Path(out_dir) / name, pa.table({"text": text}), n_files)


def long_tail_name(max_tokens: int) -> str:
    """The source name ``make-demo-data --long-tail`` uses: ``longtail_32k`` for 32768, else ``longtail_N``."""
    return f"longtail_{max_tokens // 1024}k" if max_tokens % 1024 == 0 else f"longtail_{max_tokens}"


def max_tokens_of_name(name: str) -> int | None:
    """The inverse of :func:`long_tail_name`: 262144 for ``longtail_256k``; None for another name."""
    match = re.fullmatch(r"longtail_(\d+)(k?)", name)
    if not match:
        return None
    return int(match.group(1)) * (1024 if match.group(2) else 1)
