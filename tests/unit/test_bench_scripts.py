"""The benchmarks package: every command imports and parses its arguments when run as
``python -m benchmarks.TOPIC.NAME``; every benchmark the README and docs name exists; one whose plot
needs matplotlib still finishes and prints its figures without it."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from benchmarks.common.benchlib import module_command

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
WITHOUT_MATPLOTLIB = ("import runpy, sys; sys.modules['matplotlib'] = None; module = sys.argv[1]; "
                      "sys.argv = sys.argv[1:]; runpy.run_module(module, run_name='__main__', alter_sys=True)")


def _module(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def _commands() -> list[str]:
    """Every module of the package that runs as a command."""
    return sorted(_module(p) for p in BENCHMARKS.rglob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_bench_planner_without_matplotlib_prints_its_table_and_skips_the_plot(tmp_path):
    plot = tmp_path / "planner.png"
    out = _run("-c", WITHOUT_MATPLOTLIB, "benchmarks.control_plane.plan_time", "--max-dp", "4", "--reps", "1",
               "--steps", "1", "--plot", str(plot), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| dp | plan ms (greedy) |" in out.stdout
    assert f"no plot {plot}: matplotlib is not installed" in out.stderr and not plot.exists()


def test_every_benchmark_runs_as_a_module_and_parses_its_arguments():
    """Each command imports as a package module (the package's names it uses exist) and answers
    --help, all in one process so that the imports are paid once."""
    check = ("import contextlib, io, runpy, sys\n"
             "for module in sys.argv[1:]:\n"
             "    sys.argv = [module, '--help']\n"
             "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
             "        try:\n"
             "            runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
             "        except SystemExit as exc:\n"
             "            assert exc.code in (0, None), (module, exc.code)\n"
             "    assert 'usage:' in out.getvalue(), module\n")
    commands = _commands()
    out = _run("-c", check, *commands, timeout=240)
    assert len(commands) >= 20 and out.returncode == 0, out.stderr[-3000:]


def test_every_benchmark_the_docs_name_exists():
    """``python -m benchmarks.X.Y`` is a command of the package, ``benchmarks/X/Y.py`` and ``scripts/Z``
    are files, wherever the README or a page under docs/ names them."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    commands, named = set(_commands()), []
    for page in pages:
        text = page.read_text()
        for module in re.findall(r"python[0-9.]* -m (benchmarks(?:\.[a-z0-9_]+)+)", text):
            named.append(module)
            assert module in commands, f"{page.relative_to(REPO)} names {module}, which is not a benchmark command"
        for dotted in re.findall(r"(?<![\w/])(benchmarks(?:\.[a-z0-9_]+){2,})", text):  # a module, or a name in one
            parts = dotted.split(".")
            named.append(dotted)
            assert any((REPO.joinpath(*parts[:n]).with_suffix(".py")).is_file() for n in range(2, len(parts) + 1)), \
                f"{page.relative_to(REPO)} names {dotted}, which is no module of the package"
        for path in re.findall(r"\b((?:benchmarks|scripts)/[a-z0-9_/]+\.(?:py|sh))\b", text):
            named.append(path)
            assert (REPO / path).is_file(), f"{page.relative_to(REPO)} names {path}, which does not exist"
    assert len(named) >= 50


def test_benchmarks_import_as_a_package_only():
    """No module of the package edits ``sys.path`` or imports the tests."""
    for path in BENCHMARKS.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"sys\.path\.(insert|append)|^\s*(from|import) tests\b", text, re.M), path


def test_a_benchmark_module_under_another_checkout_measures_that_checkouts_code(tmp_path):
    """``module_command`` (the start-up and plan-time baselines): the benchmark is this checkout's, the
    ``flight_overlord`` it measures is the one first on the child's path (here a second checkout)."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "flight_overlord").symlink_to(REPO / "flight_overlord", target_is_directory=True)
    command = [*module_command("benchmarks.control_plane.plan_time"), "--one", "8", "greedy", "1", "samples"]
    out = subprocess.run(command, cwd=other, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1].endswith(f'"package": "{other / "flight_overlord"}"}}')
