"""What the benchmarks share: their header, the demo corpus and configs over it, timing, and
the PSS/CPU measurement of process trees.

A benchmark runs as a module from the repository root (``python -m benchmarks.TOPIC.NAME``), so
``benchmarks`` and the checkout's ``flight_overlord`` import as packages.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import psutil
import yaml

MiB = 1024 * 1024
REPO = Path(__file__).resolve().parents[2]
PSS_INTERVAL = 1.0


def log(message: str) -> None:
    """Progress, on stderr: stdout is the report."""
    print(message, file=sys.stderr, flush=True)


def pyplot(path: Path):
    """``matplotlib.pyplot`` (headless) for the plot at ``path``, or None when matplotlib is not
    installed: the benchmark's figures are printed anyway, only the plot is skipped (said on stderr)."""
    try:
        import matplotlib
    except ImportError:
        log(f"no plot {path}: matplotlib is not installed (pip install -e '.[bench]')")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_plot(fig, path: Path) -> None:
    """Lay ``fig`` out, write it to ``path`` (its folder made) and say where (relative to the repo)."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) else path}", flush=True)


# ---------------------------------------------------------------------------------------------
# Header
# ---------------------------------------------------------------------------------------------

def program() -> list[str]:
    """What runs this process after the interpreter: ``-m MODULE`` for a benchmark run as a module (where
    ``sys.argv[0]`` holds the module's file instead), else the script."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return ["-m", spec.name] if spec is not None else sys.argv[:1]


def command_line() -> str:
    """``$ `` and the command this process runs (the interpreter relative to the cwd)."""
    return "$ " + shlex.join([os.path.relpath(sys.executable), *program(), *sys.argv[1:]])


# Runs `python -m MODULE ARGS` with only this checkout's `benchmarks` package registered by its location:
# every other import, flight_overlord included, resolves on the interpreter's own path.
_RUN_BENCHMARK_MODULE = (
    "import importlib.util, runpy, sys\n"
    "folder, module = sys.argv[1:3]\n"
    "spec = importlib.util.spec_from_file_location('benchmarks', folder + '/__init__.py',"
    " submodule_search_locations=[folder])\n"
    "package = importlib.util.module_from_spec(spec)\n"
    "sys.modules['benchmarks'] = package\n"
    "spec.loader.exec_module(package)\n"
    "sys.argv = [module, *sys.argv[3:]]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n")


def module_command(module: str, python: str = sys.executable) -> list[str]:
    """The command that runs benchmark ``module`` (``benchmarks.TOPIC.NAME``) under interpreter ``python``,
    measuring the ``flight_overlord`` that interpreter imports (another venv's, or ``PYTHONPATH``'s) rather
    than the checkout's: run it in a folder other than the repository root, which ``-c`` puts first on the path."""
    return [python, "-c", _RUN_BENCHMARK_MODULE, str(REPO / "benchmarks"), module]


def machine() -> str:
    from importlib.metadata import version

    import pyarrow as pa
    ram = psutil.virtual_memory().total / 2**30
    return (f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), {ram:.1f} GiB RAM, "
            f"{platform.system()} {platform.release()}; Python {platform.python_version()}, "
            f"pyarrow {pa.__version__}, torch {version('torch')}, numpy {np.__version__}")


def print_header(extra: str = "") -> None:
    """The command, the machine and its load: the first lines of a deployment benchmark's output.
    Also makes SIGTERM run the caller's finally blocks (clusters stop, temp dirs go)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(command_line())
    print(f"machine: {machine()}{extra}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def argument_parser(doc: str) -> argparse.ArgumentParser:
    """A parser whose description is the first paragraph of the script's docstring, and whose
    --help shows the rest of it as written."""
    return argparse.ArgumentParser(prog=shlex.join(["python", *program()]), description=doc.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_corpus_args(p: argparse.ArgumentParser, *, scale: float) -> None:
    p.add_argument("--scale", type=float, default=scale, help=f"demo corpus scale when generating (default {scale})")
    p.add_argument("--data", type=Path, help="demo corpus dir (generated there if empty; default: a temp dir)")


def add_mesh_args(p: argparse.ArgumentParser, *, microbatches: int) -> None:
    p.add_argument("--ranks", type=int, default=2, help="data-parallel trainer ranks (default 2)")
    p.add_argument("--context-length", type=int, default=4096)
    p.add_argument("--microbatches", type=int, default=microbatches, help=f"per rank and step (default {microbatches})")


def add_run_args(p: argparse.ArgumentParser, *, steps: int, timeout: float, context_length: int = 4096,
                 microbatches: int | None = 2, warmup: int | None = 2, rows_per_source: int | None = 2000) -> None:
    """The flags of a benchmark that runs a real deployment over a generated corpus (None: not offered)."""
    if rows_per_source is not None:
        p.add_argument("--rows-per-source", type=int, default=rows_per_source)
    p.add_argument("--steps", type=int, default=steps)
    if warmup is not None:
        p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--context-length", type=int, default=context_length)
    if microbatches is not None:
        p.add_argument("--microbatches", type=int, default=microbatches)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=timeout)


def timed_runs(fn: Callable[[], object], reps: int) -> tuple[object, list[float]]:
    """(the last result of ``fn()``, the seconds of each of the ``reps`` calls)."""
    times, result = [], None
    for _ in range(reps):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, times


# ---------------------------------------------------------------------------------------------
# The demo corpus, configs over it, and what a deployment says about itself
# ---------------------------------------------------------------------------------------------

def ensure_corpus(data_dir: Path, names: list[str], scale: float) -> None:
    """Generate the demo corpus in ``data_dir`` unless every source in ``names`` has Parquet files there."""
    if all(list((data_dir / n).glob("*.parquet")) for n in names):
        log(f"corpus: using {data_dir}")
        return
    from flight_overlord.demo.data import make_demo_data
    from flight_overlord.demo.images import IMAGE_SOURCE_NAMES
    started = time.monotonic()
    make_demo_data(data_dir, seed=0, scale=scale, images=bool(set(names) & set(IMAGE_SOURCE_NAMES)))
    log(f"corpus: generated at scale {scale} in {data_dir} ({time.monotonic() - started:.1f}s)")


@contextmanager
def workspace(prefix: str, data: Path | None, names: list[str], scale: float) -> Iterator[tuple[Path, Path]]:
    """(a temp dir removed on exit, the corpus dir: ``data`` or one in the temp dir, made if needed).
    A run that gets through ends its report with the wall time since entering."""
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        data_dir = (data or tmp / "data").resolve()
        ensure_corpus(data_dir, names, scale)
        yield tmp, data_dir
        print(f"\nwall time: {time.monotonic() - started:.0f}s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_config(path: Path, data_dir: Path, sources: list[dict], *, ranks: int, context_length: int,
                 microbatches: int, tokens_per_step: int, seed: int, run_dir: Path, **sections) -> Path:
    """A run config over the demo corpus in ``data_dir`` on loopback ports: ``sources`` are dicts with
    ``name`` and any other source keys (the paths are ``NAME/*.parquet``); ``sections`` are further
    top-level keys (balance, vision, ...)."""
    config = {
        "seed": seed,
        "data_root": str(data_dir),
        "run_dir": str(run_dir),
        "sources": [{"name": s["name"], "paths": f"{s['name']}/*.parquet", **s} for s in sources],
        "mesh": {"dp": ranks},
        "global_batch": {"context_length": context_length, "microbatches": microbatches,
                         "tokens_per_step": tokens_per_step},
        **sections,
        "network": {"host": "127.0.0.1", "planner_port": 0},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def plan_imbalance(planner: str, first: int, last: int) -> str:
    """A note on the Planner's own per-step stats over steps ``first``..``last`` (best effort: for
    the notes only, so a failure is the note)."""
    import pyarrow.flight as fl

    from flight_overlord import wire
    from flight_overlord.wire.actions import StatsRequest
    try:
        client = fl.connect(planner)
        stats = wire.call(client, "stats", StatsRequest(first, last).to_wire(), timeout=10)
        client.close()
        balanced = [s["imbalance"] for s in stats.values()]
        unbalanced = [s["imbalance_unbalanced"] for s in stats.values()]
        return (f"plan rank-cost imbalance (max/mean) over the timed steps: {np.mean(balanced):.3f} "
                f"(same samples unbalanced: {np.mean(unbalanced):.3f})")
    except Exception as exc:  # noqa: BLE001 - informational only
        return f"(plan stats unavailable: {type(exc).__name__})"


# ---------------------------------------------------------------------------------------------
# PSS and CPU of process trees
# ---------------------------------------------------------------------------------------------

Root = tuple[int, str, str]  # (pid, label of the process, label of its descendants)


def role_label(name: str, *, by_source: bool = False) -> str:
    """planner, loader (``by_source``: loader:SOURCE) or constructor, from a LocalCluster child's name."""
    parts = name.split("-")
    return f"loader:{parts[1]}" if by_source and parts[0] == "loader" else parts[0]


def cluster_roots(cluster, *, by_source: bool = False) -> list[Root]:
    """The role processes of a started ``LocalCluster``, labelled by ``role_label``."""
    return [(c.process.pid, role_label(c.name, by_source=by_source), "child") for c in cluster.children]


def tree_usage(roots: list[Root]) -> dict[int, tuple[str, int, float]]:
    """pid -> (label, PSS bytes, CPU seconds so far) for every process of the trees under ``roots``."""
    procs: dict[int, tuple[psutil.Process, str]] = {}
    for pid, label, child_label in roots:
        try:
            root = psutil.Process(pid)
            procs[root.pid] = (root, label)
            for child in root.children(recursive=True):
                procs[child.pid] = (child, child_label)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    usage = {}
    for pid, (proc, label) in procs.items():
        try:
            with proc.oneshot():
                cpu = proc.cpu_times()
                usage[pid] = (label, proc.memory_full_info().pss, cpu.user + cpu.system)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return usage


def busy_cpu_seconds() -> float:
    """Machine-wide non-idle CPU seconds since boot."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


class PssSampler:
    """Samples ``tree_usage(roots())`` now and every ``interval`` seconds until ``stop()``.

    Keeps the max and the last of the summed PSS (the max with its per-label split) and, from the first and last
    samples, the CPU seconds each label used in between.
    """

    def __init__(self, roots: Callable[[], list[Root]], interval: float = PSS_INTERVAL):
        self.roots = roots
        self.interval = interval
        self.max_pss = 0
        self.end_pss = 0  # the last sample's total (``stop()`` takes one with every process still up)
        self.processes = 0
        self.samples = 0
        self.pss_by_label: dict[str, tuple[int, int]] = {}  # label -> (processes, PSS) at the max
        self.cpu_by_label: dict[str, float] = {}
        self._first: dict[int, tuple[str, int, float]] | None = None
        self._window = (0.0, 0.0)
        self._busy = (0.0, 0.0)  # machine-wide busy CPU seconds at the first and the last sample
        self.deployment_cpu = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pss", daemon=True)

    def start(self) -> "PssSampler":
        self._thread.start()
        return self

    def sample(self) -> None:
        now, usage, busy = time.monotonic(), tree_usage(self.roots()), busy_cpu_seconds()
        self.samples += 1
        if self._first is None:
            self._first, self._window, self._busy = usage, (now, now), (busy, busy)
        self._window, self._busy = (self._window[0], now), (self._busy[0], busy)
        total = self.end_pss = sum(pss for _, pss, _ in usage.values())
        if total > self.max_pss:
            self.max_pss, self.processes = total, len(usage)
            self.pss_by_label = {}
            for label, pss, _ in usage.values():
                n, sum_pss = self.pss_by_label.get(label, (0, 0))
                self.pss_by_label[label] = (n + 1, sum_pss + pss)
        self.cpu_by_label = {}
        for pid, (label, _, cpu) in usage.items():
            if pid in self._first:
                self.cpu_by_label[label] = self.cpu_by_label.get(label, 0.0) + cpu - self._first[pid][2]
        self.deployment_cpu = sum(self.cpu_by_label.values())

    def cores_by_label(self) -> dict[str, float]:
        """CPU cores each process kind used while timed (its CPU seconds over the sampled window; {}: too short)."""
        seconds = self._window[1] - self._window[0]
        return {label: c / seconds for label, c in self.cpu_by_label.items()} if seconds >= 1.0 else {}

    def summary(self) -> list[str]:
        memory = ", ".join(f"{label} {n}x {pss / MiB:.0f}" for label, (n, pss) in self.pss_by_label.items())
        seconds = self._window[1] - self._window[0]
        lines = [f"PSS by process kind at the max (MiB): {memory}"]
        if seconds < 1.0:
            lines.append("CPU shares: the timed phase was too short to measure them (use more --steps)")
        else:
            cpu = ", ".join(f"{label} {c / seconds:.2f}" for label, c in self.cpu_by_label.items())
            other = max(0.0, self._busy[1] - self._busy[0] - self.deployment_cpu) / seconds
            lines.append(f"CPU in cores while timed ({seconds:.1f}s between first and last sample): {cpu}; "
                         f"total {self.deployment_cpu / seconds:.2f}; everything else on the machine "
                         f"(this driver, other users): {other:.2f}")
        return lines

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        """Stop, after one last sample (every process of the deployment is still alive here)."""
        self._stop.set()
        self._thread.join()
        self.sample()
