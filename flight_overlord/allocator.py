"""Keep a long-running loader process's heap from creeping up (glibc malloc only; a no-op elsewhere).

A loader host frees and reallocates row-group-sized arrays all day from dozens of threads. With
glibc's defaults that memory is kept: every thread may get its own arena (up to 8 per core), and
the mmap threshold rises to the size of the largest block freed, so later row groups land in
arenas that fragment instead of being mapped and unmapped. Measured over 12,000 steps at 96
sources, one process with every actor (docs/methods/memory-peers.md): PSS +11% with the defaults,
flat with these settings. So: a fixed mmap threshold, two arenas, and a periodic ``malloc_trim``.

Loader hosts (and the one-process node) also run with glibc's per-thread caches (tcache) off. Each
thread keeps up to 7 freed blocks of each of 64 small sizes for itself; a loader host has ~110 threads
(two per actor, gRPC's), whose caches fill over thousands of steps: at 96 sources a loader host grows
+7 % from step 2,000 to 20,000 with them, +4-5 % without, and is ~7 MiB smaller at every step without
them (measured, docs/methods/memory-peers.md). glibc reads that setting only as a process starts (``$GLIBC_TUNABLES``),
so ``overlord serve loader|node`` runs itself again with it set (``exec``: the same pid and arguments).
Not under ``--backend ray``: its loader actors start in Ray's workers, so set the variable in the Ray
cluster's environment there.

Every role process also moves Arrow's default memory pool from mimalloc (or jemalloc) to the system
allocator: those keep freed pages per thread, at 96 sources and 8 ranks ~4 MiB per trainer, ~10 MiB
in a constructor and ~5 MiB in the Planner (measured, docs/methods/memory-peers.md), for no speed that
shows at these sizes. Arrow reads the choice once, as pyarrow loads: the ``overlord`` command sets it
for its process tree. A trainer is the user's process, so its pool moves only when the user asks:
``system_pool_if_first_to_load_pyarrow`` first thing in the training script, or
``TrainerClient(system_allocator=True)`` (``use_system_pool``: the Python-level pool only).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import threading
import time

log = logging.getLogger(__name__)
M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # mallopt parameters (malloc.h)
MMAP_THRESHOLD = 256 * 1024  # blocks at least this big are mapped and unmapped: freed row groups leave
ARENAS = 2
TRIM_SECONDS = 5.0
POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"  # Arrow's own setting: where it is set, it wins
TUNABLES_ENV = "GLIBC_TUNABLES"  # glibc's settings, read once at process start: "name=value:name=value"
TCACHE_COUNT = "glibc.malloc.tcache_count"
EXEC_MARK_ENV = "OVERLORD_TCACHE_EXEC"  # the pid that ran itself again: never twice (see without_thread_caches)

_libc = None
_lock = threading.Lock()
_last_trim = 0.0


def _glibc():
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc = libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else False
        except OSError:
            _libc = False
    return _libc


def tame() -> bool:
    """Set the mmap threshold and arena count for this process; False where malloc is not glibc's."""
    libc = _glibc()
    if not libc:
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_ARENA_MAX, ARENAS) == 1
    if not ok:
        log.warning("mallopt refused the loader's allocator settings; memory may creep up over a long run")
    return ok


def without_thread_caches() -> None:
    """This process again, with glibc's per-thread malloc caches off, unless ``$GLIBC_TUNABLES`` sets
    them already (to anything: a choice made outside wins). ``exec`` keeps the pid, arguments and the
    rest of the environment; the variable, inherited, marks it done. Call it first thing in a
    process started from the command line: anything it did before is done again. Not with glibc: nothing.
    At most once per pid: a "secure" Python (setuid, file capabilities) has glibc drop the tunable from
    the variable, which would otherwise look unset again after every ``exec``."""
    tunables = os.environ.get(TUNABLES_ENV, "")
    if not _glibc() or any(t.split("=")[0] == TCACHE_COUNT for t in tunables.split(":")) \
            or os.environ.get(EXEC_MARK_ENV) == str(os.getpid()):
        return
    os.environ[TUNABLES_ENV] = ":".join(filter(None, [tunables, f"{TCACHE_COUNT}=0"]))
    os.environ[EXEC_MARK_ENV] = str(os.getpid())  # keyed to the pid: a child process still runs itself again
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)


def trim_now_and_then() -> None:
    """Give freed heap pages back to the system, at most every ``TRIM_SECONDS`` (after a buffer release)."""
    global _last_trim
    now = time.monotonic()
    if not _glibc() or now - _last_trim < TRIM_SECONDS:
        return
    with _lock:
        if now - _last_trim < TRIM_SECONDS:
            return
        _last_trim = now
    trim()


def trim() -> None:
    """Give freed heap pages back to the system now (after a one-off corpus-sized transient)."""
    libc = _glibc()
    if libc:
        libc.malloc_trim(0)


def system_pool_for_this_process_tree() -> None:
    """Arrow's default pool is the system allocator in this process and the ones it starts, unless
    ``$ARROW_DEFAULT_MEMORY_POOL`` says otherwise. Arrow reads the setting once, when pyarrow loads,
    and its C++ parts (Flight's reads, Parquet, compute) use that pool whatever Python sets later:
    so this must run before ``import pyarrow`` (the ``overlord`` command does it first thing)."""
    os.environ.setdefault(POOL_ENV, "system")


def system_pool_if_first_to_load_pyarrow() -> bool:
    """Load pyarrow with Arrow's default pool on the system allocator, its C++ parts (Flight's reads)
    included, when pyarrow is not loaded yet and ``$ARROW_DEFAULT_MEMORY_POOL`` names no pool: what a
    training script calls first thing to have its trainer's Flight reads there (torch does not load
    pyarrow; the client does, and leaves the pool alone). mimalloc keeps ~4 MiB of freed pages per
    trainer (docs/methods/memory-peers.md).
    The variable is set only while pyarrow loads (Arrow reads it then, once), so the trainer's own
    child processes are left as they were. False where pyarrow was loaded before (its C++ pool is
    fixed: set the variable in the trainer's environment to choose it) or the variable is set."""
    if "pyarrow" in sys.modules or os.environ.get(POOL_ENV):
        return False
    os.environ[POOL_ENV] = "system"
    try:
        import pyarrow  # noqa: F401 - Arrow reads the variable here
    finally:
        os.environ.pop(POOL_ENV, None)
    return True


def use_system_pool() -> bool:
    """pyarrow's default memory pool (what Python-level calls allocate from) becomes the system
    allocator, unless ``$ARROW_DEFAULT_MEMORY_POOL`` names one (then it stays as chosen, and this
    returns False). For a process that imported pyarrow already, such as a trainer's; buffers
    allocated before keep their own pool."""
    if os.environ.get(POOL_ENV):
        return False
    import pyarrow as pa
    pa.set_memory_pool(pa.system_memory_pool())
    return True
