"""A config's ``sources``: each source's files (paths, globs, URIs, data folders), format, columns
and transform; errors name the key (``sources[2].paths``) or the file."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import formats, source_files
from .fields import REQUIRED, as_choice, as_int, as_number, check_keys
from .model import ConfigError, SourceConfig, TransformConfig

# Row groups per shuffle window of a source (sources[].shuffle_window): see docs/methods/data-order.md
SHUFFLE_WINDOW = 2


def parse_sources(raw: Any, data_root: Path, *, expand_files: bool = True) -> tuple[SourceConfig, ...]:
    """``expand_files=False``: each source's globs are expanded when its files are first asked for (a
    process that finds the row groups by catalog digest never lists the folders nor keeps the paths)."""
    if not isinstance(raw, list) or not raw:
        raise ConfigError("sources: expected a non-empty list of sources")
    sources, names = [], set()
    for i, item in enumerate(raw):
        where = f"sources[{i}]"
        f = check_keys(item, where, {
            "name": REQUIRED, "paths": REQUIRED, "text_column": "text",
            "transform": None, "weight": 1.0, "loaders": 1, "image_column": None,
            "shuffle_window": SHUFFLE_WINDOW, "format": "auto", "tokens_column": None, "loss_mask_column": None,
        })
        name = str(f["name"])
        if name in names:
            raise ConfigError(f"{where}.name: duplicate source name {name!r}")
        if ":" in name:
            raise ConfigError(f"{where}.name: {name!r} may not contain ':' (it is part of sample keys)")
        names.add(name)
        paths = SourcePaths(f["paths"], data_root, f"{where}.paths")
        if expand_files:
            paths.expand()
        sources.append(SourceConfig(
            name=name,
            paths=paths,
            text_column=str(f["text_column"]),
            transform=_source_transform(f, where, data_root),
            weight=as_number(f["weight"], f"{where}.weight", minimum=0.0),
            loaders=as_int(f["loaders"], f"{where}.loaders", minimum=1),
            image_column=None if f["image_column"] is None else str(f["image_column"]),
            shuffle_window=as_int(f["shuffle_window"], f"{where}.shuffle_window", minimum=1),
            format=as_choice(f["format"], f"{where}.format", ("auto", *formats.FORMATS)),
            tokens_column=_column(f["tokens_column"]),
            loss_mask_column=_column(f["loss_mask_column"]),
        ))
    if sum(s.weight for s in sources) <= 0:
        raise ConfigError("sources: at least one source needs a positive weight")
    return tuple(sources)


def _column(value: Any) -> str | None:
    return None if value is None else str(value)


def _source_transform(f: dict, where: str, data_root: Path) -> TransformConfig | None:
    """A text source's transform (``byte_tokenizer`` by default); a pre-tokenized source
    (``tokens_column``) has none, and what only text sources take is refused."""
    if f["tokens_column"] is None:
        if f["loss_mask_column"] is not None:
            raise ConfigError(f"{where}.loss_mask_column: needs tokens_column (a loss mask is per token id)")
        return _parse_transform("byte_tokenizer" if f["transform"] is None else f["transform"],
                                f"{where}.transform", data_root)
    for key in ("transform", "image_column"):
        if f[key] is not None:
            raise ConfigError(f"{where}.{key}: a pre-tokenized source (tokens_column) takes no {key}")
    return None


class SourcePaths:
    """A source's files and their ids, expanded from the config's ``paths`` once, when first asked for
    (a pattern that matches nothing is then a ConfigError naming ``where``). Equal when the files are."""

    def __init__(self, raw: Any, data_root: Path, where: str):
        self._raw, self._data_root, self._where = raw, data_root, where
        self._expanded: tuple[tuple[str, ...], tuple[str, ...]] | None = None

    def expand(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if self._expanded is None:
            files = _resolve_paths(self._raw, self._data_root, self._where)
            self._expanded = files, tuple(_file_id(p, self._data_root) for p in files)
        return self._expanded

    @property
    def expanded(self) -> bool:
        return self._expanded is not None

    @property
    def files(self) -> tuple[str, ...]:
        return self.expand()[0]

    @property
    def file_ids(self) -> tuple[str, ...]:
        return self.expand()[1]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SourcePaths) and self.expand() == other.expand()

    def __hash__(self) -> int:
        return hash(self.expand())

    def __repr__(self) -> str:
        return f"SourcePaths({self._raw!r})"


def _resolve_paths(raw: Any, data_root: Path, where: str) -> tuple[str, ...]:
    """The files of a source: local paths and globs (relative to ``data_root``), or URIs (``s3://``,
    ``gs://``, ``hdfs://``, ``file://``, globs included) read through ``pyarrow.fs``."""
    patterns = [raw] if isinstance(raw, str) else raw
    if not isinstance(patterns, list) or not patterns:
        raise ConfigError(f"{where}: expected a path, a glob or a list of them")
    files: list[str] = []
    for pattern in patterns:
        if source_files.is_uri(str(pattern)):
            try:
                matches = source_files.expand(str(pattern))
            except source_files.StorageError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            full = source_files.display(str(pattern))
        else:
            full = str(relative_path(data_root, pattern, where, resolve=False))
            matches, folders = source_files.local_matches(full)
            for m in folders:  # a Hugging Face datasets folder (or a folder of data files)
                try:
                    matches.extend(formats.directory_files(Path(m)))
                except source_files.StorageError as exc:
                    raise ConfigError(f"{where}: {exc}") from None
        if not matches:
            what = "no file matches the glob" if source_files.has_magic(str(pattern)) else "file not found"
            raise ConfigError(f"{where}: {what}: {full}")
        files.extend(matches)
    return tuple(sorted(set(files)))


def _file_id(path: str, data_root: Path) -> str:
    if source_files.is_uri(path):
        return source_files.display(path)
    root = str(data_root).rstrip(os.sep) + os.sep  # lexical, as Path.relative_to: a string test per file
    return path[len(root):] if path.startswith(root) else path


def _parse_transform(raw: Any, where: str, data_root: Path) -> TransformConfig:
    """A name, or a mapping with ``name`` and the factory's options. A ``path`` option (e.g. the
    ``hf_tokenizer`` file) names a file: a relative one is resolved against ``data_root`` here,
    because transform factories never see the config, and it must exist."""
    if isinstance(raw, str):
        return TransformConfig(name=_registered_transform(raw, where))
    if isinstance(raw, dict) and "name" in raw:
        _registered_transform(raw["name"], f"{where}.name")
        options = {k: v for k, v in raw.items() if k != "name"}
        if "path" in options:
            if not isinstance(options["path"], str) or not options["path"]:
                raise ConfigError(f"{where}.path: expected a file path, got {options['path']!r}")
            file = (data_root / options["path"]).resolve()
            if not file.is_file():
                raise ConfigError(f"{where}.path: file not found: {file}")
            options["path"] = str(file)
        return TransformConfig(name=str(raw["name"]), options=options)
    raise ConfigError(f"{where}: expected a transform name or a mapping with 'name'")


def _registered_transform(name: Any, where: str) -> str:
    from ..transforms import TRANSFORMS
    if name not in TRANSFORMS:
        raise ConfigError(f"{where}: unknown transform {name!r} (registered: {', '.join(TRANSFORMS)}; "
                          f"a config's own go in a file named under plugins:)")
    return name


def relative_path(base: Path, value: Any, where: str, *, resolve: bool = True) -> Path:
    """``value`` as a path relative to ``base``; a value no file system takes (a NUL byte) names its key."""
    text = str(value)
    if "\x00" in text:
        raise ConfigError(f"{where}: a path may not contain a NUL byte: {text!r}")
    path = base / text
    return path.resolve() if resolve else path
