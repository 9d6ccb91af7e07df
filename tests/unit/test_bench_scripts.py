"""The benchmark scripts: each imports and parses its arguments; one whose plot needs matplotlib still
finishes and prints its figures without it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
WITHOUT_MATPLOTLIB = ("import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = sys.argv[1:]; "
                      "sys.path.insert(0, sys.argv[0].rsplit('/', 1)[0]); runpy.run_path(sys.argv[0], run_name='__main__')")


def test_bench_planner_without_matplotlib_prints_its_table_and_skips_the_plot(tmp_path):
    plot = tmp_path / "planner.png"
    out = subprocess.run([sys.executable, "-c", WITHOUT_MATPLOTLIB, str(SCRIPTS / "bench_planner.py"), "--max-dp", "4",
                          "--reps", "1", "--steps", "1", "--plot", str(plot)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| dp | plan ms (greedy) |" in out.stdout
    assert f"no plot {plot}: matplotlib is not installed" in out.stderr and not plot.exists()


def test_every_benchmark_imports_and_parses_its_arguments():
    """What the README names runs: each scripts/bench_*.py imports (the package's names it uses
    exist) and answers --help, all in one process so that the imports are paid once."""
    check = ("import contextlib, io, runpy, sys\n"
             "for path in sys.argv[1:]:\n"
             "    sys.argv = [path, '--help']\n"
             "    sys.path.insert(0, path.rsplit('/', 1)[0])\n"
             "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
             "        try:\n"
             "            runpy.run_path(path, run_name='__main__')\n"
             "        except SystemExit as exc:\n"
             "            assert exc.code in (0, None), (path, exc.code)\n"
             "    assert 'usage:' in out.getvalue(), path\n")
    scripts = sorted(str(p) for p in SCRIPTS.glob("bench_*.py"))
    out = subprocess.run([sys.executable, "-c", check, *scripts], capture_output=True, text=True, timeout=240)
    assert len(scripts) >= 10 and out.returncode == 0, out.stderr[-3000:]
