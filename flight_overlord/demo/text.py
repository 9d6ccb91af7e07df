"""Shaping the raw material into each demo source's samples (lengths in UTF-8 bytes)."""
from __future__ import annotations

import math
import re
from typing import Callable

import numpy as np

from .material import Material, identifier_words


def nbytes(text: str) -> int:
    return len(text.encode("utf-8"))


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def cut(text: str, max_bytes: int, min_bytes: int = 1) -> str:
    """``text`` cut to at most ``max_bytes``, at a whitespace boundary if that keeps >= ``min_bytes``."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    head = data[:max_bytes].decode("utf-8", "ignore")
    boundary = max(head.rfind(" "), head.rfind("\n"))
    if boundary > 0 and nbytes(head[:boundary].rstrip()) >= min_bytes:
        return head[:boundary].rstrip()
    return head


def fill(rng: np.random.Generator, pool: list[str], min_bytes: int, sep: str = "\n\n",
          clean: Callable[[str], str] = str.strip) -> str:
    """Consecutive (cleaned) items of ``pool`` from a random start, joined until >= ``min_bytes``."""
    i = int(rng.integers(len(pool)))
    parts, size = [], -len(sep)
    while size < min_bytes and len(parts) < len(pool):
        parts.append(clean(pool[i % len(pool)]))
        size += len(sep) + nbytes(parts[-1])
        i += 1
    return sep.join(parts)


def _window(rng: np.random.Generator, text: str, max_bytes: int, min_bytes: int) -> str:
    """A piece of ``text`` of ``min_bytes..max_bytes``: its start half the time, else from a random line."""
    if nbytes(text) > max_bytes and rng.random() >= 0.5:
        starts = [0] + [m.end() for m in re.finditer("\n", text)]
        limit = len(text) - max_bytes        # character offset, a safe bound for a byte window
        starts = [s for s in starts if s <= limit] or [0]
        text = text[starts[int(rng.integers(len(starts)))]:]
    return cut(text, max_bytes, min_bytes)


def log_uniform(rng: np.random.Generator, low: float, high: float) -> int:
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

def _short_caption(mat: Material, rng: np.random.Generator) -> str:
    """A phrase of at most 64 bytes: a docstring's first line, an identifier as words, or a comment."""
    while True:
        kind = rng.choice(3, p=[0.5, 0.2, 0.3])
        if kind == 0 and mat.docstrings:
            text = mat.docstrings[int(rng.integers(len(mat.docstrings)))].strip().split("\n")[0]
            text = text.rstrip(".")
        elif kind == 1 and mat.identifiers:
            text = identifier_words(mat.identifiers[int(rng.integers(len(mat.identifiers)))])
        elif mat.comments:
            text = mat.comments[int(rng.integers(len(mat.comments)))]
        else:
            continue
        target = int(np.clip(rng.lognormal(math.log(40), 0.4), 8, 64))
        text = cut(_one_line(text), target)
        if nbytes(text) >= 3:
            return text


def gen_captions(mat: Material, rng: np.random.Generator, n: int) -> list[str]:
    n_long = max(1, round(0.02 * n))
    long_rows = set(rng.permutation(n)[:n_long].tolist())
    pool = mat.paragraphs + mat.docstrings
    out = []
    for row in range(n):
        if row in long_rows:
            target = log_uniform(rng, 65, 1500)
            out.append(cut(fill(rng, pool, target + 1, sep=" ", clean=_one_line), target, 65))
        else:
            out.append(_short_caption(mat, rng))
    return out


def gen_longdocs(mat: Material, rng: np.random.Generator, n: int) -> list[str]:
    pools = [p for p in (mat.licences, [src for _, src in mat.modules], mat.doc_texts) if p]
    out = []
    for _ in range(n):
        target = log_uniform(rng, 1000, 8000)
        pool = pools[int(rng.integers(len(pools)))]
        text = fill(rng, pool, target + 1)
        out.append(_window(rng, text, target, max(1000, int(0.9 * target))))
    return out


def gen_code(mat: Material, rng: np.random.Generator, n: int) -> list[str]:
    pool = [d.source for d in mat.defs if 100 <= nbytes(d.source) <= 3000]
    return _pick(rng, pool, n)


def gen_docstrings(mat: Material, rng: np.random.Generator, n: int) -> list[str]:
    pool = [d for d in dict.fromkeys(mat.docstrings) if 40 <= nbytes(d) <= 2000]
    return _pick(rng, pool, n)


def gen_manuals(mat: Material, rng: np.random.Generator, n: int) -> list[str]:
    pool = [p for p in mat.paragraphs if nbytes(p) >= 80]
    out = []
    for text in _pick(rng, pool, n):
        if nbytes(text) > 1500:
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
    return cut(text, int(rng.integers(300, 801)), 60)


def gen_qa(mat: Material, rng: np.random.Generator, n: int) -> list[str]:
    entries = [(d.kind, d.qualname, d.signature, d.docstring) for d in mat.defs if d.docstring]
    entries += [("module", name, name, doc) for name, doc in mat.module_docs]
    out = []
    for kind, qualname, signature, doc in _pick(rng, entries, n):
        text = _qa_pair(rng, kind, qualname, signature, doc)
        while nbytes(text) < 60:                      # too terse a docstring: take another entry
            text = _qa_pair(rng, *entries[int(rng.integers(len(entries)))])
        out.append(text)
    return out
