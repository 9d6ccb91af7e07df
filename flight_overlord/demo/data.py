"""A deterministic multi-source demo corpus, written as Parquet, built from text found on this machine.

The raw material is real text: the Python standard library sources (module sources, functions and
classes cut out by their ``ast`` line ranges, docstrings, identifiers, comments) plus the plain-text
files under ``/usr/share/common-licenses`` and ``/usr/share/doc`` (licences, copyright files,
READMEs ...). Missing directories are skipped; the standard library is always there.

Six sources with deliberately different length distributions (lengths in UTF-8 bytes, which are
tokens for the project's byte-level tokenizer), so the loader's balancing has something to balance:

==============  ========  ===================================================================
source          rows @1.0 text
==============  ========  ===================================================================
``captions``    40 000    ~98 % short phrases <= 64 B (docstring first lines, identifiers
                          turned into words, comments), ~2 % paragraphs of 65..1500 B
``longdocs``     1 500    whole licences / module sources / concatenated docs, 1000..8000 B,
                          log-uniform
``code``         8 000    whole functions and classes from the stdlib, 100..3000 B, skewed short
``docstrings``  10 000    full docstrings, 40..2000 B
``manuals``      6 000    paragraphs of documentation and licences, 80..1500 B
``qa``           8 000    "Q: What does `json.dumps` do?\\nA: ..." pairs, 60..800 B
==============  ========  ===================================================================

``make_demo_data(out_dir, seed=..., scale=...)`` writes ``out_dir/<source>/part-NNNNN.parquet``
(columns ``text: string``, ``doc_id: int64``; zstd; several row groups per file). It also writes
the image-text sources of ``demo_images`` (``imagecaps``, ``interleaved``) unless
``images=False``. Output is byte-identical for the same seed and scale on the same machine; the
gathered material is cached per process.

It also trains a small byte-level BPE tokenizer (``DEMO_VOCAB_SIZE`` tokens, ``<|endoftext|>`` is
id 0, the default ``pad_token_id``) on a bounded sample of the generated text and writes it as
``out_dir/tokenizer.json``, for the ``hf_tokenizer`` transform (``configs/demo_bpe.yaml``). That
needs the ``tokenizers`` package (the project's ``tokenizers`` extra); without it the tokenizer is
skipped with a printed note. Training is deterministic: the same seed and scale give a
byte-identical ``tokenizer.json`` (with tokenizers 0.23, whatever the thread count).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from .images import make_image_demo_data
from .layout import MIN_FILES, MIN_ROW_GROUPS, MIN_ROWS_PER_GROUP, check_arguments, layout, write_source
from .material import Material, gather_material
from .text import gen_captions, gen_code, gen_docstrings, gen_longdocs, gen_manuals, gen_qa
from .tokenizer import write_tokenizer

SOURCE_NAMES: tuple[str, ...] = ("captions", "longdocs", "code", "docstrings", "manuals", "qa")


@dataclass(frozen=True)
class _SourceSpec:
    rows_at_scale_1: int
    seed_offset: int
    generate: Callable[[Material, np.random.Generator, int], list[str]]


_SOURCES: dict[str, _SourceSpec] = {
    "captions": _SourceSpec(40_000, 1_000, gen_captions),
    "longdocs": _SourceSpec(1_500, 2_000, gen_longdocs),
    "code": _SourceSpec(8_000, 3_000, gen_code),
    "docstrings": _SourceSpec(10_000, 4_000, gen_docstrings),
    "manuals": _SourceSpec(6_000, 5_000, gen_manuals),
    "qa": _SourceSpec(8_000, 6_000, gen_qa),
}


# ---------------------------------------------------------------------------------------------
# The demo corpus.
# ---------------------------------------------------------------------------------------------

def make_demo_data(out_dir: str | os.PathLike, *, seed: int = 0, scale: float = 1.0,
                   images: bool = True, tokenizer: bool = True) -> dict[str, list[Path]]:
    """Write out_dir/<source>/part-00000.parquet ... ; return {source: [paths]}. Deterministic from seed
    (byte-identical files for the same seed+scale on the same machine).

    The text sources (``SOURCE_NAMES``, in that order) have columns ``text`` (string) and
    ``doc_id`` (int64, unique within its source). With ``images`` the image-text sources of
    ``demo_images.IMAGE_SOURCE_NAMES`` follow them, with columns ``texts``, ``images`` and
    ``doc_id``. Every file has several row groups. At ``scale=1.0`` each source has 4 files of
    ~6 row groups; row counts scale linearly, clamped to at least 2 files x 2 row groups.
    Existing ``part-*.parquet`` files in the source directories are replaced.

    With ``tokenizer`` (and the ``tokenizers`` package) it also writes ``out_dir/tokenizer.json``,
    a byte-level BPE trained on the text sources (see the module docstring); it is not in the
    returned mapping.
    """
    check_arguments(seed, scale)
    mat = gather_material()
    out = Path(out_dir)
    result, texts = {}, {}
    for name in SOURCE_NAMES:
        spec = _SOURCES[name]
        rows, n_files = layout(spec.rows_at_scale_1, scale)
        texts[name] = spec.generate(mat, np.random.default_rng(int(seed) + spec.seed_offset), rows)
        result[name] = write_source(out / name, pa.table({"text": pa.array(texts[name], pa.string())}), n_files)
    if tokenizer:
        write_tokenizer(out, texts)
    if images:
        result.update(make_image_demo_data(out, seed=seed, scale=scale))
    return result


# ---------------------------------------------------------------------------------------------
# Many sources: the same generators at many scales, for memory-vs-sources benchmarks.
# ---------------------------------------------------------------------------------------------

MANY_SOURCES_SEED_OFFSET = 100_000


def many_source_names(n_sources: int) -> list[str]:
    """``src000``, ``src001``, ... (at least three digits, more when ``n_sources`` needs them)."""
    width = max(3, len(str(max(n_sources - 1, 0))))
    return [f"src{i:0{width}d}" for i in range(n_sources)]


def many_source_plan(n_sources: int, *, seed: int = 0, rows_per_source: int = 2000) -> list[dict]:
    """What ``make_many_sources`` writes, without writing it: one dict per source with ``name``,
    ``generator`` (one of ``SOURCE_NAMES``, cycling), ``rows`` (``rows_per_source`` times a factor
    log-uniform in [1/4, 4], drawn from ``seed``) and ``files`` (1..4). Deterministic from its arguments."""
    if isinstance(n_sources, bool) or not isinstance(n_sources, (int, np.integer)) or n_sources < 1:
        raise ValueError(f"n_sources must be a positive integer, got {n_sources!r}")
    if not rows_per_source >= MIN_FILES * MIN_ROW_GROUPS * MIN_ROWS_PER_GROUP:
        raise ValueError(f"rows_per_source must be >= {MIN_FILES * MIN_ROW_GROUPS * MIN_ROWS_PER_GROUP}, "
                         f"got {rows_per_source!r}")
    check_arguments(seed, 1.0)
    rng = np.random.default_rng([int(seed), MANY_SOURCES_SEED_OFFSET, int(n_sources)])
    factors = np.exp(rng.uniform(np.log(0.25), np.log(4.0), n_sources))
    files = rng.integers(1, 5, n_sources)
    plan = []
    for i, name in enumerate(many_source_names(n_sources)):
        n_files = max(MIN_FILES, int(files[i]))
        rows = max(round(rows_per_source * factors[i]), n_files * MIN_ROW_GROUPS * MIN_ROWS_PER_GROUP)
        plan.append({"name": name, "generator": SOURCE_NAMES[i % len(SOURCE_NAMES)], "rows": rows, "files": n_files})
    return plan


def make_many_sources(out_dir: str | os.PathLike, n_sources: int, *, seed: int = 0,
                      rows_per_source: int = 2000) -> dict[str, list[Path]]:
    """Write ``n_sources`` text sources ``out_dir/srcNNN/part-NNNNN.parquet``; return {source: [paths]}.

    Source ``i`` uses the demo text generator ``SOURCE_NAMES[i % 6]`` (so the length distributions,
    and with them the tokenization cost per row, cycle over the six demo shapes) at its own size
    from ``many_source_plan`` and its own generator seed, so no two sources hold the same rows. Same
    columns and writer (``write_source``) as ``make_demo_data``; deterministic from the arguments.
    """
    mat = gather_material()
    out = Path(out_dir)
    result = {}
    for i, spec in enumerate(many_source_plan(n_sources, seed=seed, rows_per_source=rows_per_source)):
        generate = _SOURCES[spec["generator"]].generate
        rng = np.random.default_rng([int(seed), MANY_SOURCES_SEED_OFFSET, i])
        texts = generate(mat, rng, spec["rows"])
        result[spec["name"]] = write_source(out / spec["name"], pa.table({"text": pa.array(texts, pa.string())}),
                                            spec["files"])
    return result
