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

import ast
import functools
import gzip
import math
import os
import re
import sys
import sysconfig
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SOURCE_NAMES: tuple[str, ...] = ("captions", "longdocs", "code", "docstrings", "manuals", "qa")

FILES_AT_SCALE_1 = 4
ROW_GROUPS_PER_FILE = 6
MIN_FILES = 2
MIN_ROW_GROUPS = 2
MIN_ROWS_PER_GROUP = 4

LICENSE_DIR = Path("/usr/share/common-licenses")
DOC_DIR = Path("/usr/share/doc")
_MAX_FILE_BYTES = 128 * 1024            # read at most this much of any one documentation file
_MAX_DOC_BYTES = 48 * 1024 * 1024       # and at most this much documentation in total
_SKIP_STDLIB_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test",
                               "__pycache__"})
_DOC_NAME = re.compile(r"(?i)^(copyright|readme|news|authors|thanks|todo|faq|bugs|install|usage)"
                       r"([._-].*)?$|\.(txt|md|rst|text)$")


# ---------------------------------------------------------------------------------------------
# Material: gathered once per process, in a deterministic (sorted) order.
# ---------------------------------------------------------------------------------------------

@dataclass
class _Def:
    """A function or class cut out of a stdlib module."""
    qualname: str          # "json.JSONEncoder.encode"
    module: str            # "json"
    kind: str              # "function" | "class"
    signature: str         # "encode(self, o)" / "JSONEncoder(...)" header text
    source: str            # dedented source lines of the whole definition
    docstring: str | None


@dataclass
class _Material:
    modules: list[tuple[str, str]] = field(default_factory=list)   # (module name, source text)
    defs: list[_Def] = field(default_factory=list)
    docstrings: list[str] = field(default_factory=list)              # module/class/function
    module_docs: list[tuple[str, str]] = field(default_factory=list)  # (module name, docstring)
    comments: list[str] = field(default_factory=list)
    identifiers: list[str] = field(default_factory=list)
    licences: list[str] = field(default_factory=list)                # whole licence texts
    doc_texts: list[str] = field(default_factory=list)               # whole /usr/share/doc texts
    paragraphs: list[str] = field(default_factory=list)              # paragraphs of the two above


def _valid_utf8(text: str) -> str:
    """Drop what cannot be UTF-8 encoded (lone surrogates from string literals) and NULs."""
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "")


def _read_text(path: Path) -> str | None:
    """A file's text (gunzipped if ``.gz``), at most ``_MAX_FILE_BYTES``; None if unreadable/binary."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                data = f.read(_MAX_FILE_BYTES)
        else:
            with open(path, "rb") as f:
                data = f.read(_MAX_FILE_BYTES)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if not data or b"\x00" in data:
        return None
    return _valid_utf8(data.decode("utf-8", "replace"))


def _read_source(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return None


def _sorted_files(root: Path, skip_dirs: frozenset[str] = frozenset()) -> list[Path]:
    """Every regular file under ``root`` in sorted order, not following directory symlinks."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs)
        out.extend(Path(dirpath, name) for name in sorted(filenames))
    return [p for p in out if p.is_file()]


def _stdlib_files() -> list[tuple[str, Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in _sorted_files(root, _SKIP_STDLIB_DIRS):
        if path.suffix != ".py":
            continue
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts:
            out.append((".".join(parts), path))
    return out


def _identifier_words(name: str) -> str:
    """``HTTPConnection`` -> ``http connection``; ``read_config_file`` -> ``read config file``."""
    words = re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+", name)
    return " ".join(w.lower() for w in words)


def _def_header(lines: list[str], node: ast.AST) -> str:
    """``name(args) -> ret``: the ``def``/``class`` source up to where the body starts."""
    body = node.body[0]
    head = lines[node.lineno - 1:body.lineno - 1]
    last = lines[body.lineno - 1].encode("utf-8")[:body.col_offset].decode("utf-8", "ignore")
    header = " ".join((re.sub(r"\s#.*$", "", line) if "#" in line else line).strip()
                      for line in head + [last])
    header = re.sub(r"^(async\s+)?(def|class)\s+", "", header.strip())
    return re.sub(r"\s+", " ", header).rstrip(": ")


def _add_module(mat: _Material, module: str, source: str) -> None:
    source = source.replace("\r\n", "\n").replace("\r", "\n")
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    lines = source.split("\n")
    mat.modules.append((module, source))
    doc = ast.get_docstring(tree)
    if doc:
        doc = _valid_utf8(doc)
        mat.docstrings.append(doc)
        mat.module_docs.append((module, doc))
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#") and not stripped.startswith(("#!", "# -*-")):
            comment = stripped.lstrip("#").strip()
            if len(comment) >= 8 and re.search(r"[A-Za-z]{3}", comment):
                mat.comments.append(comment)
    _add_defs(mat, module, module, tree, lines)


_DEF_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_BLOCK_NODES = (ast.stmt, ast.excepthandler, ast.match_case)


def _add_defs(mat: _Material, module: str, prefix: str, parent: ast.AST, lines: list[str]) -> None:
    """Functions and classes below ``parent``: also class members and defs inside if/try/...

    Function bodies are not searched (few nested functions have docstrings; it would be slow).
    """
    for node in ast.iter_child_nodes(parent):
        if not isinstance(node, _DEF_NODES):
            if isinstance(node, _BLOCK_NODES):
                _add_defs(mat, module, prefix, node, lines)
            continue
        qualname = f"{prefix}.{node.name}"
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        source = "\n".join(lines[start - 1:node.end_lineno])
        source = textwrap.dedent(source) if node.col_offset else source
        doc = ast.get_docstring(node)
        doc = _valid_utf8(doc) if doc else None
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        mat.defs.append(_Def(qualname, module, kind, _def_header(lines, node), source, doc))
        mat.identifiers.append(node.name)
        if doc:
            mat.docstrings.append(doc)
        if kind == "class":
            _add_defs(mat, module, qualname, node, lines)


def _paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs (Debian's `` .`` lines count as blank), dedented."""
    text = re.sub(r"(?m)^[ \t]*\.[ \t]*$", "", text)
    paragraphs = (p.strip("\n") for p in re.split(r"\n[ \t]*\n", text))
    return [(textwrap.dedent(p) if p[0] in " \t" else p).strip() for p in paragraphs if p.strip()]


def _documentation_files() -> list[Path]:
    if not DOC_DIR.is_dir():
        return []
    return [p for p in _sorted_files(DOC_DIR)
            if _DOC_NAME.search(p.name[:-3] if p.name.endswith(".gz") else p.name)
            and "changelog" not in p.name.lower()]


@functools.lru_cache(maxsize=1)
def _material() -> _Material:
    """Gather (once per process) all the text the generators draw from."""
    mat = _Material()
    for module, path in _stdlib_files():
        source = _read_source(path)
        if source is not None:
            _add_module(mat, module, source)
    if LICENSE_DIR.is_dir():
        licences = (_read_text(p) for p in _sorted_files(LICENSE_DIR))
        mat.licences = list(dict.fromkeys(t for t in licences if t))   # GPL -> GPL-3 symlinks
    total = 0
    for path in _documentation_files():
        if total >= _MAX_DOC_BYTES:
            break
        text = _read_text(path)
        if text:
            total += len(text)
            mat.doc_texts.append(text)
    mat.doc_texts = list(dict.fromkeys(mat.doc_texts))     # many packages share a copyright file
    paragraphs = (p for text in mat.licences + mat.doc_texts for p in _paragraphs(text))
    mat.paragraphs = list(dict.fromkeys(paragraphs))       # de-duplicate, keep first-seen order
    if not mat.paragraphs:                                  # no /usr/share material: use docstrings
        mat.paragraphs = list(dict.fromkeys(p for d in mat.docstrings for p in _paragraphs(d)))
    return mat


# ---------------------------------------------------------------------------------------------
# Text helpers.
# ---------------------------------------------------------------------------------------------

def _nbytes(text: str) -> int:
    return len(text.encode("utf-8"))


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _cut(text: str, max_bytes: int, min_bytes: int = 1) -> str:
    """``text`` cut to at most ``max_bytes``, at a whitespace boundary if that keeps >= ``min_bytes``."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    head = data[:max_bytes].decode("utf-8", "ignore")
    boundary = max(head.rfind(" "), head.rfind("\n"))
    if boundary > 0 and _nbytes(head[:boundary].rstrip()) >= min_bytes:
        return head[:boundary].rstrip()
    return head


def _fill(rng: np.random.Generator, pool: list[str], min_bytes: int, sep: str = "\n\n",
          clean: Callable[[str], str] = str.strip) -> str:
    """Consecutive (cleaned) items of ``pool`` from a random start, joined until >= ``min_bytes``."""
    i = int(rng.integers(len(pool)))
    parts, size = [], -len(sep)
    while size < min_bytes and len(parts) < len(pool):
        parts.append(clean(pool[i % len(pool)]))
        size += len(sep) + _nbytes(parts[-1])
        i += 1
    return sep.join(parts)


def _window(rng: np.random.Generator, text: str, max_bytes: int, min_bytes: int) -> str:
    """A piece of ``text`` of ``min_bytes..max_bytes``: its start half the time, else from a random line."""
    if _nbytes(text) > max_bytes and rng.random() >= 0.5:
        starts = [0] + [m.end() for m in re.finditer("\n", text)]
        limit = len(text) - max_bytes        # character offset, a safe bound for a byte window
        starts = [s for s in starts if s <= limit] or [0]
        text = text[starts[int(rng.integers(len(starts)))]:]
    return _cut(text, max_bytes, min_bytes)


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> int:
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def _pick(rng: np.random.Generator, pool: list, n: int) -> list:
    """``n`` items of ``pool`` in random order; each item used once before any is used twice."""
    rounds = [rng.permutation(len(pool)) for _ in range(-(-n // len(pool)))]
    return [pool[i] for i in np.concatenate(rounds)[:n]]


def _first_paragraph(doc: str) -> str:
    return _one_line(re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0])


# ---------------------------------------------------------------------------------------------
# One generator per source: (material, rng, n) -> n texts.
# ---------------------------------------------------------------------------------------------

def _short_caption(mat: _Material, rng: np.random.Generator) -> str:
    """A phrase of at most 64 bytes: a docstring's first line, an identifier as words, or a comment."""
    while True:
        kind = rng.choice(3, p=[0.5, 0.2, 0.3])
        if kind == 0 and mat.docstrings:
            text = mat.docstrings[int(rng.integers(len(mat.docstrings)))].strip().split("\n")[0]
            text = text.rstrip(".")
        elif kind == 1 and mat.identifiers:
            text = _identifier_words(mat.identifiers[int(rng.integers(len(mat.identifiers)))])
        elif mat.comments:
            text = mat.comments[int(rng.integers(len(mat.comments)))]
        else:
            continue
        target = int(np.clip(rng.lognormal(math.log(40), 0.4), 8, 64))
        text = _cut(_one_line(text), target)
        if _nbytes(text) >= 3:
            return text


def _gen_captions(mat: _Material, rng: np.random.Generator, n: int) -> list[str]:
    n_long = max(1, round(0.02 * n))
    long_rows = set(rng.permutation(n)[:n_long].tolist())
    pool = mat.paragraphs + mat.docstrings
    out = []
    for row in range(n):
        if row in long_rows:
            target = _log_uniform(rng, 65, 1500)
            out.append(_cut(_fill(rng, pool, target + 1, sep=" ", clean=_one_line), target, 65))
        else:
            out.append(_short_caption(mat, rng))
    return out


def _gen_longdocs(mat: _Material, rng: np.random.Generator, n: int) -> list[str]:
    pools = [p for p in (mat.licences, [src for _, src in mat.modules], mat.doc_texts) if p]
    out = []
    for _ in range(n):
        target = _log_uniform(rng, 1000, 8000)
        pool = pools[int(rng.integers(len(pools)))]
        text = _fill(rng, pool, target + 1)
        out.append(_window(rng, text, target, max(1000, int(0.9 * target))))
    return out


def _gen_code(mat: _Material, rng: np.random.Generator, n: int) -> list[str]:
    pool = [d.source for d in mat.defs if 100 <= _nbytes(d.source) <= 3000]
    return _pick(rng, pool, n)


def _gen_docstrings(mat: _Material, rng: np.random.Generator, n: int) -> list[str]:
    pool = [d for d in dict.fromkeys(mat.docstrings) if 40 <= _nbytes(d) <= 2000]
    return _pick(rng, pool, n)


def _gen_manuals(mat: _Material, rng: np.random.Generator, n: int) -> list[str]:
    pool = [p for p in mat.paragraphs if _nbytes(p) >= 80]
    out = []
    for text in _pick(rng, pool, n):
        if _nbytes(text) > 1500:
            text = _window(rng, text, int(rng.integers(600, 1501)), 80)
        out.append(text)
    return out


_QUESTIONS = {
    "function": ("What does `{q}` do?", "What is `{q}` used for?", "How do I use `{q}`?",
                 "Explain `{q}`.", "What is the signature of `{q}`?"),
    "class": ("What is `{q}`?", "What is the `{q}` class for?", "Describe the class `{q}`."),
    "module": ("What is the `{q}` module for?", "What does the Python module `{q}` provide?"),
}


def _qa_pair(rng: np.random.Generator, kind: str, qualname: str, signature: str, doc: str) -> str:
    questions = _QUESTIONS[kind]
    question = questions[int(rng.integers(len(questions)))].format(q=qualname)
    answer = _first_paragraph(doc)
    if "signature" in question or (kind != "module" and rng.random() < 0.3):
        answer = f"`{signature}`: {answer}"
    text = f"Q: {question}\nA: {answer}"
    return _cut(text, int(rng.integers(300, 801)), 60)


def _gen_qa(mat: _Material, rng: np.random.Generator, n: int) -> list[str]:
    entries = [(d.kind, d.qualname, d.signature, d.docstring) for d in mat.defs if d.docstring]
    entries += [("module", name, name, doc) for name, doc in mat.module_docs]
    out = []
    for kind, qualname, signature, doc in _pick(rng, entries, n):
        text = _qa_pair(rng, kind, qualname, signature, doc)
        while _nbytes(text) < 60:                      # too terse a docstring: take another entry
            text = _qa_pair(rng, *entries[int(rng.integers(len(entries)))])
        out.append(text)
    return out


@dataclass(frozen=True)
class _SourceSpec:
    rows_at_scale_1: int
    seed_offset: int
    generate: Callable[[_Material, np.random.Generator, int], list[str]]


_SOURCES: dict[str, _SourceSpec] = {
    "captions": _SourceSpec(40_000, 1_000, _gen_captions),
    "longdocs": _SourceSpec(1_500, 2_000, _gen_longdocs),
    "code": _SourceSpec(8_000, 3_000, _gen_code),
    "docstrings": _SourceSpec(10_000, 4_000, _gen_docstrings),
    "manuals": _SourceSpec(6_000, 5_000, _gen_manuals),
    "qa": _SourceSpec(8_000, 6_000, _gen_qa),
}


# ---------------------------------------------------------------------------------------------
# The demo tokenizer.
# ---------------------------------------------------------------------------------------------

TOKENIZER_FILE = "tokenizer.json"
DEMO_VOCAB_SIZE = 4096
TOKENIZER_SAMPLE_BYTES = 4 * 1024 * 1024   # trained on at most this much text: ~1 s on two cores
SPECIAL_TOKENS = ("<|endoftext|>",)         # id 0: the configs' default pad_token_id


def _tokenizer_sample(texts: dict[str, list[str]], budget: int = TOKENIZER_SAMPLE_BYTES) -> list[str]:
    """An equal byte share of every source: its first rows (they are in random order already)."""
    share = budget // max(1, len(texts))
    sample = []
    for rows in texts.values():
        used = 0
        for text in rows:
            if used >= share:
                break
            sample.append(text)
            used += _nbytes(text)
    return sample


def train_demo_tokenizer(texts: list[str], vocab_size: int = DEMO_VOCAB_SIZE):
    """A byte-level BPE (GPT-2 style, no prefix space: decoding gives the text back exactly)
    trained on ``texts``; a ``tokenizers.Tokenizer``. Raises ImportError without ``tokenizers``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def _write_tokenizer(out: Path, texts: dict[str, list[str]]) -> Path | None:
    """Train the demo tokenizer on a sample of ``texts``; write ``out/tokenizer.json``. Without the
    ``tokenizers`` package: print a note, write nothing and return None."""
    try:
        tokenizer = train_demo_tokenizer(_tokenizer_sample(texts))
    except ImportError:
        print(f"note: the 'tokenizers' package is not installed, so no {TOKENIZER_FILE} was written "
              f"(the Parquet data was); the 'hf_tokenizer' transform and configs/demo_bpe.yaml need "
              f"it: pip install tokenizers", file=sys.stderr)
        return None
    path = out / TOKENIZER_FILE
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


# ---------------------------------------------------------------------------------------------
# Writing.
# ---------------------------------------------------------------------------------------------

def _layout(rows_at_scale_1: int, scale: float) -> tuple[int, int]:
    """(rows, files) for a source: linear in ``scale``, clamped to >= 2 files x 2 row groups x 4 rows."""
    n_files = max(MIN_FILES, round(FILES_AT_SCALE_1 * scale))
    rows = max(round(rows_at_scale_1 * scale), n_files * MIN_ROW_GROUPS * MIN_ROWS_PER_GROUP)
    return rows, n_files


def _write_source(directory: Path, table: pa.Table, n_files: int) -> list[Path]:
    """Split ``table``'s rows over ``n_files`` files of several row groups, adding ``doc_id``."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("part-*.parquet"):        # from an earlier run at another scale
        stale.unlink()
    paths, first_id = [], 0
    for i, rows in enumerate(np.array_split(np.arange(table.num_rows), n_files)):
        n_groups = max(MIN_ROW_GROUPS, min(ROW_GROUPS_PER_FILE, len(rows) // MIN_ROWS_PER_GROUP))
        part = table.slice(first_id, len(rows))
        part = part.append_column("doc_id", pa.array(np.arange(first_id, first_id + len(rows)), pa.int64()))
        path = directory / f"part-{i:05d}.parquet"
        pq.write_table(part, path, row_group_size=math.ceil(len(rows) / n_groups), compression="zstd")
        paths.append(path)
        first_id += len(rows)
    return paths


def _check_arguments(seed: int, scale: float) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")


def make_demo_data(out_dir: str | os.PathLike, *, seed: int = 0, scale: float = 1.0,
                   images: bool = True, tokenizer: bool = True) -> dict[str, list[Path]]:
    """Write out_dir/<source>/part-00000.parquet ... ; return {source: [paths]}. Deterministic from seed (byte-identical files for the same seed+scale on the same machine).

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
    _check_arguments(seed, scale)
    mat = _material()
    out = Path(out_dir)
    result, texts = {}, {}
    for name in SOURCE_NAMES:
        spec = _SOURCES[name]
        rows, n_files = _layout(spec.rows_at_scale_1, scale)
        texts[name] = spec.generate(mat, np.random.default_rng(int(seed) + spec.seed_offset), rows)
        result[name] = _write_source(out / name, pa.table({"text": pa.array(texts[name], pa.string())}), n_files)
    if tokenizer:
        _write_tokenizer(out, texts)
    if images:
        from .images import make_image_demo_data    # it imports this module's helpers
        result.update(make_image_demo_data(out, seed=seed, scale=scale))
    return result
