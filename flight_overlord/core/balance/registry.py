"""Things registered by name (balancers, cost models, sample transforms, context-parallel splits),
with one behaviour for all of them: a name is a non-empty string, registering a taken name is an
error naming both entries, and looking up an unknown name is an error listing the known ones.
``flight_overlord.orchestration`` exports every ``register_*``. Here, not in ``core/``, so that the
balance package stays self-contained; ``core/registry.py`` re-exports it.
"""
from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


class UnknownName(ValueError, KeyError):
    """A name no entry is registered under. Both a ValueError (a bad config or request) and a
    KeyError (a lookup), so callers of either kind catch it; its message is the plain text."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(dict):
    """``name -> entry`` in registration order; ``what`` names the kind in errors ("cost model")."""

    def __init__(self, what: str, hint: str = ""):
        super().__init__()
        self.what = what
        self.hint = hint  # appended to the unknown-name error: what else the caller may pass

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``entry`` becomes available under ``name`` (returned unchanged)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.what} name must be a non-empty string, got {name!r}")

        def decorate(entry: T) -> T:
            if name in self:
                raise ValueError(f"{self.what} {name!r} is already registered ({_label(self[name])}); "
                                 f"cannot register {_label(entry)} under the same name")
            self[name] = entry
            return entry
        return decorate

    def __missing__(self, name):
        raise UnknownName(f"unknown {self.what} {name!r} (registered: {', '.join(self) or 'none'}"
                          f"{'; ' + self.hint if self.hint else ''})")

    def names(self) -> tuple[str, ...]:
        return tuple(self)


def _label(entry) -> str:
    """How an entry is named in an error: its qualified name when it has one."""
    module, name = getattr(entry, "__module__", None), getattr(entry, "__qualname__", None)
    return f"{module}.{name}" if module and name else repr(entry)
