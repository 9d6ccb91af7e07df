"""A config's user code (``plugins:``): imported by every process that reads the config.

Each entry is a Python file (relative to the config's folder) or a module name (on ``sys.path``, or in
the config's folder). Importing it runs its ``register_transform`` / ``register_balancer`` /
``register_cost_model`` decorators, so the names it registers are known to the config's checks and
to every role, whatever started the process (``overlord up``, ``overlord serve``, a Ray actor, a tool).
A plugin is imported once per process: loading the config again does not register twice.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError


def import_plugins(raw: Any, base_dir: Path) -> tuple[str, ...]:
    """Import every plugin ``raw`` names; returns them as imported (files resolved, modules as named)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(p, str) and p.strip() for p in raw):
        raise ConfigError(f"plugins: expected a list of Python files or module names, got {raw!r}")
    return tuple(_import(entry.strip(), base_dir, f"plugins[{i}]") for i, entry in enumerate(raw))


def _import(entry: str, base_dir: Path, where: str) -> str:
    is_file = entry.endswith(".py") or "/" in entry or "\\" in entry
    if is_file:
        path = (base_dir / entry).resolve()
        if not path.is_file():
            raise ConfigError(f"{where}: file not found: {path}")
        name = f"overlord_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:10]}"
        folder, what = path.parent, str(path)
    else:
        name, folder, what = entry, base_dir, entry
    if name in sys.modules:
        return what
    sys.path.insert(0, str(folder))  # a plugin may import modules beside it
    try:
        if is_file:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        else:
            importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if not is_file and exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise ConfigError(f"{where}: no module named {name!r} (not on sys.path nor in {base_dir})") from None
        raise ConfigError(f"{where}: cannot import {what}: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - user code: its error, named, in one line
        raise ConfigError(f"{where}: cannot import {what}: {type(exc).__name__}: {exc}") from None
    finally:
        sys.path.remove(str(folder))
    return what
