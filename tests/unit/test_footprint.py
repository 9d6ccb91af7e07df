"""What a trainer process and a role process load: the memory each of them costs per rank and per node
(docs/methods/memory-peers.md). Each check runs in a fresh interpreter, as a trainer or role starts."""
import os
import subprocess
import sys

import pytest


def _run(code: str, env: dict | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"} | (env or {})
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env,
                          timeout=120).stdout.strip()


def test_the_trainer_client_does_not_load_the_config_parser_or_its_readers():
    loaded = _run("import sys; from flight_overlord import TrainerClient; "
                  "print(' '.join(m for m in ('flight_overlord.config', 'PIL', 'pyarrow.parquet', 'pyarrow.fs', "
                  "'flight_overlord.core.balance') if m in sys.modules))")
    assert loaded == "", f"a trainer process loads {loaded}"


def test_the_trainer_client_moves_pyarrows_pool_to_the_system_allocator_unless_told_otherwise():
    code = ("import pyarrow as pa; from flight_overlord import TrainerClient; "
            "c = TrainerClient('grpc://127.0.0.1:1', 0, {}); print(pa.default_memory_pool().backend_name); c.close()")
    assert _run(code.format("")) == "system"
    assert _run(code.format("system_allocator=False")) != "system"
    assert _run(code.format(""), {"ARROW_DEFAULT_MEMORY_POOL": "jemalloc"}) == "jemalloc"


@pytest.mark.parametrize("chosen", [None, "jemalloc"])
def test_role_processes_use_the_system_allocator_in_arrows_own_code_unless_told_otherwise(chosen):
    """Arrow's C++ parts (Flight reads, Parquet) take the pool set before pyarrow loads: the ``overlord``
    command sets it first thing, for every role it serves or starts."""
    env = {"ARROW_DEFAULT_MEMORY_POOL": chosen} if chosen else {}
    code = ("import os, flight_overlord.deploy.cli, pyarrow as pa; "
            "print(pa.default_memory_pool().backend_name, os.environ['ARROW_DEFAULT_MEMORY_POOL'])")
    assert _run(code, env) == f"{chosen or 'system'} {chosen or 'system'}"


@pytest.mark.parametrize("chosen", [None, "jemalloc"])
def test_the_client_loads_pyarrow_with_the_system_allocator_for_flights_reads_and_leaves_the_environment(chosen):
    """A training script imports torch and the client; the client is the first to load pyarrow, so Arrow's
    C++ pool (what Flight's reads allocate from) is the system allocator, unless the variable chooses;
    the variable is not left behind for the trainer's own child processes."""
    env = {"ARROW_DEFAULT_MEMORY_POOL": chosen} if chosen else {}
    code = ("import os, flight_overlord.client, pyarrow as pa; "
            "print(pa.default_memory_pool().backend_name, os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))")
    assert _run(code, env) == f"{chosen or 'system'} {chosen}"


def test_the_client_leaves_arrows_own_pool_alone_where_pyarrow_was_loaded_first():
    """(Arrow's pool is fixed once pyarrow has loaded; the client cannot change it then.)"""
    code = "import pyarrow as pa, flight_overlord.client; print(pa.default_memory_pool().backend_name)"
    assert _run(code) != "system"


@pytest.mark.parametrize("argv,tunables,runs", [
    (None, None, 2),                                # `overlord serve loader`: runs again with the caches off
    (None, "glibc.malloc.tcache_count=3", 1),       # chosen outside: left alone
    (["serve", "loader", "--help"], None, 1),       # main() called in another program's process: never exec'd
])
def test_serve_loader_runs_itself_again_without_glibcs_thread_caches(argv, tunables, runs):
    """A loader host's ~110 threads each filled a malloc cache of their own over a long run
    (flight_overlord/allocator.py): its command runs again, same pid, with them off."""
    env = {"GLIBC_TUNABLES": tunables} if tunables else {}
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | env
    code = ("import os, sys; from flight_overlord.deploy import cli; "
            "print('run', os.getpid(), os.environ.get('GLIBC_TUNABLES'), flush=True); "
            f"sys.argv = ['overlord', 'serve', 'loader', '--help']; cli.main({argv!r})")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env,
                         timeout=120).stdout
    lines = [line.split() for line in out.splitlines() if line.startswith("run ")]
    assert len(lines) == runs and "usage:" in out
    assert len({pid for _, pid, _ in lines}) == 1
    assert lines[-1][2] == (tunables or ("glibc.malloc.tcache_count=0" if runs == 2 else "None"))
