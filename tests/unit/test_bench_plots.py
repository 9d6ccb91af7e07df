"""A benchmark whose plot needs matplotlib still finishes and prints its figures without it."""
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
