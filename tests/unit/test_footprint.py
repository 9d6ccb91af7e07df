"""What a trainer process and a role process load: the memory each of them costs per rank and per node
(docs/methods/memory-peers.md). Each check runs in a fresh interpreter, as a trainer or role starts."""
import functools
import os
import subprocess
import sys

import pyarrow as pa
import pytest

CHOSEN = "chosen"  # a parameter: the variable names a pool of this build other than the system allocator


def _run(code: str, env: dict | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"} | (env or {})
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env,
                          timeout=120).stdout.strip()


@functools.cache
def _build_default() -> str:
    """The pool this pyarrow build loads with when nothing chooses one (mimalloc or jemalloc where built in)."""
    return _run("import pyarrow as pa; print(pa.default_memory_pool().backend_name)")


def _default_other_than_system() -> str:
    """The build's default pool, for the checks that tell "moved to the system allocator" from "left as it
    was": they say nothing where the default is the system allocator, so they skip there."""
    if _build_default() == "system":
        pytest.skip("this pyarrow build's default pool is the system allocator: moved and left alone look the same")
    return _build_default()


def _pool_other_than_system() -> str:
    """A pool of this build for the variable to choose (not the default where there is another): the
    check is that the choice wins over the system allocator; skipped where the build has no other pool."""
    others = sorted((name for name in pa.supported_memory_backends() if name != "system"),
                    key=lambda name: name == _build_default())
    if not others:
        pytest.skip("this pyarrow build has only the system allocator: there is no other pool to choose")
    return others[0]


def _chosen(parameter: str | None) -> str | None:
    return _pool_other_than_system() if parameter == CHOSEN else None


def test_the_trainer_client_does_not_load_the_config_parser_or_its_readers():
    loaded = _run("import sys; from flight_overlord import TrainerClient; "
                  "print(' '.join(m for m in ('flight_overlord.config', 'PIL', 'pyarrow.parquet', 'pyarrow.fs', "
                  "'flight_overlord.core.balance') if m in sys.modules))")
    assert loaded == "", f"a trainer process loads {loaded}"


def test_the_trainer_client_moves_pyarrows_pool_to_the_system_allocator_only_when_asked():
    """A library leaves its host process's pool alone: the client moves the Python-level pool from the
    build's default to the system allocator only with ``system_allocator=True``, and not even then where
    the variable chooses."""
    default, chosen = _default_other_than_system(), _pool_other_than_system()
    code = ("import pyarrow as pa; from flight_overlord import TrainerClient; "
            "c = TrainerClient('grpc://127.0.0.1:1', 0, {}); print(pa.default_memory_pool().backend_name); c.close()")
    assert _run(code.format("")) == default
    assert _run(code.format("system_allocator=True")) == "system"
    assert _run(code.format("system_allocator=True"), {"ARROW_DEFAULT_MEMORY_POOL": chosen}) == chosen


@pytest.mark.parametrize("chosen", [None, CHOSEN])
def test_role_processes_use_the_system_allocator_in_arrows_own_code_unless_told_otherwise(chosen):
    """Arrow's C++ parts (Flight reads, Parquet) take the pool set before pyarrow loads: the ``overlord``
    command's ``main`` sets it first thing, for every role it serves or starts. Run here as a role process
    runs (``overlord serve planner``, which loads pyarrow with the role's module), stopped by ``--help``."""
    chosen = _chosen(chosen)
    env = {"ARROW_DEFAULT_MEMORY_POOL": chosen} if chosen else {}
    code = ("import os, sys, flight_overlord.deploy.cli as cli\n"
            "try:\n    cli.main(['serve', 'planner', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'flight_overlord.planner.server' in sys.modules\n"
            "import pyarrow as pa\n"
            "print(pa.default_memory_pool().backend_name, os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))")
    assert _run(code, env).splitlines()[-1] == f"{chosen or 'system'} {chosen or 'system'}"


def test_importing_the_command_leaves_the_environment_alone():
    """Only running ``overlord`` chooses the pool for its process tree: a process that imports the module
    (a test, a script calling one of its functions) passes its own environment on to what it starts."""
    code = "import os, flight_overlord.deploy.cli; print(os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))"
    assert _run(code) == "None"


def test_importing_the_client_leaves_arrows_pool_and_the_environment_alone():
    """The client loads pyarrow as the process left it: Arrow's own pool is the build's default."""
    default = _default_other_than_system()
    code = ("import os, flight_overlord.client, pyarrow as pa; "
            "print(pa.default_memory_pool().backend_name, os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))")
    assert _run(code) == f"{default} None"


@pytest.mark.parametrize("chosen", [None, CHOSEN])
def test_a_training_script_that_asks_first_gets_the_system_allocator_for_flights_reads(chosen):
    """A training script that calls ``system_pool_if_first_to_load_pyarrow`` before anything loads pyarrow
    has Arrow's C++ pool (what Flight's reads allocate from) on the system allocator, unless the variable
    chooses; the variable is not left behind for the trainer's own child processes."""
    chosen = _chosen(chosen)
    env = {"ARROW_DEFAULT_MEMORY_POOL": chosen} if chosen else {}
    code = ("import os; from flight_overlord import allocator; allocator.system_pool_if_first_to_load_pyarrow(); "
            "import flight_overlord.client, pyarrow as pa; "
            "print(pa.default_memory_pool().backend_name, os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))")
    assert _run(code, env) == f"{chosen or 'system'} {chosen}"


def test_the_client_leaves_arrows_own_pool_alone_where_pyarrow_was_loaded_first():
    """(Arrow's pool is fixed once pyarrow has loaded; the client cannot change it then.)"""
    default = _default_other_than_system()
    code = "import pyarrow as pa, flight_overlord.client; print(pa.default_memory_pool().backend_name)"
    assert _run(code) == default


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


def test_a_process_runs_itself_again_at_most_once():
    """Where glibc drops the tunable from the variable (a "secure" Python), the exec'd process would find
    it unset again and exec for ever: the pid that ran itself again is marked, and never does it twice."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    code = ("import os, sys; from flight_overlord import allocator; from flight_overlord.deploy import cli; "
            "os.environ[allocator.EXEC_MARK_ENV] = str(os.getpid()); print('run', flush=True); "
            "sys.argv = ['overlord', 'serve', 'loader', '--help']; cli.main()")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env,
                         timeout=120).stdout
    assert out.count("run\n") == 1 and "usage:" in out
