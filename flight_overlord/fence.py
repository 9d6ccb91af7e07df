"""Fencing: a process that was replaced while it hung must not serve or plan anything when it wakes up.

Each role process claims its role's fence when it starts: ``run_dir/fences/NAME`` (``planner``,
``constructor-0``, ``loader-...``) is replaced, atomically, by a file naming a generation one above the
previous holder's, this process's pid and host, and a random token. The fence is checked on every call
a role serves and before every record the Planner journals (``Fence.check``): once another process has
claimed the name (the restart that replaced a hung process, the standby that took the Planner's lease)
the old one raises :class:`~.errors.Fenced` and exits instead of answering or writing. The check is a
``stat`` of the file while it is unchanged (microseconds); ``run_dir`` is shared by every role of a run,
so the fence works across hosts as the journals do.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import socket
from pathlib import Path

from .errors import Fenced
from .journal import write_json_atomic

log = logging.getLogger(__name__)
DIRECTORY = "fences"
FENCED_EXIT_STATUS = 75  # a replaced process ends with this (EX_TEMPFAIL): not a crash to restart


class Fence:
    """This process's claim on role ``name`` of the run in ``run_dir``."""

    def __init__(self, run_dir: Path, name: str):
        self.name = name
        self.path = Path(run_dir) / DIRECTORY / name
        self.generation = 0
        self._token = secrets.token_hex(8)
        self._seen: tuple | None = None  # (inode, mtime, size) of the file when it last held our token

    def claim(self) -> int:
        """Take the role over from whoever held it; returns this process's generation."""
        previous = self.holder()
        self.generation = (previous or {}).get("generation", 0) + 1
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, {"generation": self.generation, "pid": os.getpid(), "host": socket.gethostname(),
                                      "token": self._token}, durable=True)
        self._seen = self._stat()
        log.info("fence %s: generation %d (pid %d)", self.name, self.generation, os.getpid())
        return self.generation

    def holder(self) -> dict | None:
        """Who holds the role now: {"generation", "pid", "host", "token"}, or None."""
        try:
            return json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def check(self) -> None:
        """Raise :class:`Fenced` when another process has claimed the role since this one did."""
        if self._seen is None:
            return  # never claimed: a role object used in-process (tests, tools)
        stat = self._stat()
        if stat == self._seen:
            return
        holder = self.holder()
        if holder is not None and holder.get("token") == self._token:
            self._seen = stat  # touched, still ours
            return
        newer = ("nobody" if holder is None else
                 f"generation {holder.get('generation')} (pid {holder.get('pid')} on {holder.get('host')})")
        raise Fenced(f"{self.name} of generation {self.generation} (pid {os.getpid()}) was replaced by {newer}: "
                     f"it serves and journals nothing more")

    def enforce(self) -> None:
        """``check``, and end this process if it was replaced (``exit_fenced``)."""
        try:
            self.check()
        except Fenced as exc:
            exit_fenced(exc)

    def _stat(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size


def claim(run_dir: Path, name: str) -> Fence:
    """A new fence of role ``name``, claimed."""
    fence = Fence(run_dir, name)
    fence.claim()
    return fence


def loader_fence_name(actors: list[tuple[str, int]], replica: int) -> str:
    """A loader process's role: the actors it hosts and which replica of them it is."""
    shadow = f"-shadow{replica}" if replica else ""
    name = "loader-" + "+".join(f"{source}-{actor}" for source, actor in actors) + shadow
    if len(name) <= 120:
        return name
    return f"loader-{hashlib.sha1(name.encode()).hexdigest()[:16]}" + (f"-shadow{replica}" if replica else "")


def exit_fenced(exc: Fenced) -> None:
    """End this process at once: it was replaced, and anything it did now would race its replacement.
    Its journals are complete (written record by record); its clients see the connection close and go
    to the replacement."""
    log.error("%s", exc)
    logging.shutdown()
    os._exit(FENCED_EXIT_STATUS)
