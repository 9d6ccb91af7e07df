"""Reading the run's secret files: tokens (one per line, trainer tokens optionally bound to ranks)
and PEM material. Errors name the config key, the file and the line, never a secret."""
from __future__ import annotations

import re
from pathlib import Path

from ..core.ranks import RankSet
from ..errors import ConfigError

MIN_TOKEN_CHARS = 16


class SecurityError(ConfigError):
    """A secret or certificate that cannot be used; the message names the key or file, never a secret."""


def read_tokens(path: Path, key: str) -> list[str]:
    """The tokens of a file, one per line (blank lines and ``#`` comments skipped); errors name
    ``key`` and the line, never a token."""
    tokens = []
    for number, line in _token_lines(path, key):
        if any(c.isspace() for c in line):
            raise SecurityError(f"{key}: line {number} of {path}: a token has no spaces")
        tokens.append(line)
    return tokens


def read_trainer_tokens(path: Path, world_size: int) -> list[tuple[str, RankSet | None]]:
    """``security.trainer_tokens_file``: ``TOKEN`` (any rank) or ``TOKEN RANKS`` (``0-7,12``: only
    those ranks) per line; a rank outside the mesh's ``world_size`` is an error naming the line."""
    key, tokens = "security.trainer_tokens_file", []
    for number, line in _token_lines(path, key):
        token, *rest = line.split()
        ranks = None
        try:
            if len(rest) > 1:
                raise ValueError("a line is TOKEN or TOKEN RANKS (e.g. 0-7,12), without spaces inside RANKS")
            ranks = RankSet.parse(rest[0]) if rest else None
            if ranks is not None and ranks.last >= world_size:
                raise ValueError(f"rank {ranks.last} is outside the mesh's {world_size} ranks")
        except ValueError as exc:
            raise SecurityError(f"{key}: line {number} of {path}: {exc}") from None
        tokens.append((token, ranks))
    return tokens


def _token_lines(path: Path, key: str) -> list[tuple[int, str]]:
    """(line number, stripped line) of a token file, blank lines and ``#`` comments (whole lines, or
    after a space) skipped, each line's first field a token of at least ``MIN_TOKEN_CHARS``; errors
    never hold a token."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SecurityError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None
    lines = [(number, line) for number, line in ((n, re.split(r"(?:^|\s)#", raw, maxsplit=1)[0].strip())
                                                 for n, raw in enumerate(text.splitlines(), 1)) if line]
    for number, line in lines:
        if len(line.split()[0]) < MIN_TOKEN_CHARS:
            raise SecurityError(f"{key}: line {number} of {path}: a token needs at least {MIN_TOKEN_CHARS} "
                                f"characters and no spaces")
    if not lines:
        raise SecurityError(f"{key}: {path} holds no token")
    return lines


def read_secret_file(path: Path, key: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SecurityError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None


def read_pem(value, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return read_secret_file(Path(value), what)
