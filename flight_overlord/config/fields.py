"""The checks every config section is read with: keys of a mapping (unknown ones named, defaults from
the section's dataclass), numbers, choices and host names, each error naming the key."""
from __future__ import annotations

import ipaddress
import math
from dataclasses import MISSING, fields
from typing import Any

from ..errors import ConfigError

REQUIRED = object()


def check_keys(raw: Any, where: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Check ``raw`` is a mapping with only keys of ``spec``; fill defaults; reject missing required keys."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(raw).__name__}")
    unknown = sorted(map(str, set(raw) - set(spec)))
    if unknown:
        raise ConfigError(
            f"unknown key {join_key(where, unknown[0])!r} (allowed: {', '.join(sorted(spec))})")
    out = {}
    for key, default in spec.items():
        if key in raw:
            out[key] = raw[key]
        elif default is REQUIRED:
            raise ConfigError(f"missing required key {join_key(where, key)!r}")
        else:
            out[key] = default
    return out


def join_key(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def as_flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def as_int(value: Any, where: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where}: must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{where}: must be <= {maximum}, got {value}")
    return value


def as_number(value: Any, where: str, *, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{where}: must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where}: must be >= {minimum}, got {value}")
    return float(value)


def as_choice(value: Any, where: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(allowed)}")
    return value


def defaults_of(cls) -> dict[str, Any]:
    """A section's keys and defaults, from its dataclass: the one place a default is written."""
    return {f.name: (REQUIRED if f.default is MISSING and f.default_factory is MISSING else
                     f.default if f.default is not MISSING else f.default_factory()) for f in fields(cls)}


def check_host(host: str, where: str) -> str:
    """A bare host name or IP address (no scheme, port or path); the error names ``where``."""
    if (not isinstance(host, str) or not host or host != host.strip() or "/" in host or "@" in host
            or (host.count(":") == 1) or (":" in host and not _is_ip(host))):
        raise ValueError(f"{where}: {host!r} is not a host name or IP address (give just the host, as in "
                         f"10.0.0.5 or node-3.cluster; no scheme, port or path)")
    return host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False
