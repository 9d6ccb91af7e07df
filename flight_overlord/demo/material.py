"""The demo corpus's raw material: real text found on this machine (the Python standard library's
sources, definitions, docstrings and comments; licences and documentation under /usr/share), gathered
once per process."""
from __future__ import annotations

import ast
import functools
import gzip
import os
import re
import sysconfig
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

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
class Material:
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


def identifier_words(name: str) -> str:
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


def _add_module(mat: Material, module: str, source: str) -> None:
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


def _add_defs(mat: Material, module: str, prefix: str, parent: ast.AST, lines: list[str]) -> None:
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
def gather_material() -> Material:
    """Gather (once per process) all the text the generators draw from."""
    mat = Material()
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
