"""The package as users get it from ``pip install .``: a wheel in a fresh virtual environment, run
from a directory that is not the repository.

The wheel is built from a copy of the working tree (no build/ or egg-info left in the repository, no
stale build/lib in the wheel) and installed with ``--no-deps``; the fresh environment gets the
dependencies from the project's .venv through a ``.pth`` line. A directory added that way has its
own ``.pth`` files ignored, so the project's editable install does not leak in (checked below).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "data", "runs", "*.egg-info", "__pycache__",
                                     ".pytest_cache")


def _run(cmd, *, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        stderr = "\n".join(line for line in out.stderr.replace("\r", "\n").splitlines() if "step/s]" not in line)
        pytest.fail(f"{cmd} exited {out.returncode}\nstdout:\n{out.stdout[-3000:]}\nstderr:\n{stderr[-6000:]}")
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=COPY_IGNORE)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", tmp / "dist", src], cwd=tmp)
    (wheel,) = (tmp / "dist").glob("flight_overlord-*.whl")

    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(env_dir)
    bin_dir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([python, "-c", purelib], cwd=tmp).stdout.strip())
    (site / "_project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index", wheel],
         cwd=tmp)
    work = tmp / "elsewhere"
    work.mkdir()
    return {"src": src, "wheel": wheel, "env": env_dir, "python": python, "overlord": bin_dir / "overlord",
            "work": work}


def test_the_wheel_ships_every_module_the_schemas_and_the_demo_config(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    src = installed["src"]
    modules = {p.relative_to(src).as_posix() for p in (src / "flight_overlord").rglob("*.py")}
    assert modules <= names, f"not in the wheel (a package setup.py does not find?): {sorted(modules - names)}"
    schemas = {f"flight_overlord/wire/schema_files/{p.name}" for p in (src / "schemas").glob("*.json")}
    assert schemas and schemas <= names
    assert "flight_overlord/demo/configs/demo.yaml" in names


def test_the_installed_package_is_the_one_imported(installed):
    out = _run([installed["python"], "-c", "import flight_overlord, flight_overlord.wire.schemas as s, "
                "flight_overlord.demo.run as r; print(flight_overlord.__file__); print(s.SCHEMA_DIR); "
                "print(len(s.load_schema(s.MICROBATCH)))"], cwd=installed["work"])
    package, schema_dir, n_fields = out.stdout.split()
    env = installed["env"].resolve()
    assert Path(package).resolve().is_relative_to(env), package
    assert Path(schema_dir).resolve().is_relative_to(env), schema_dir
    assert int(n_fields) > 0


def test_make_demo_data_then_demo_run_in_the_current_directory(installed):
    work = installed["work"]
    _run([installed["overlord"], "make-demo-data", "--scale", "0.03"], cwd=work)
    sources = {"captions", "longdocs", "code", "docstrings", "manuals", "qa"}
    assert sources <= {p.name for p in (work / "data" / "demo").iterdir()}

    out = _run([installed["overlord"], "demo", "--steps", "3"], cwd=work, timeout=180)
    assert "summary" in out.stdout and "throughput" in out.stdout, out.stdout
    config = work / "runs" / "demo" / "demo.yaml"
    raw = yaml.safe_load(config.read_text())
    assert Path(raw["data_root"]) == (work / "data" / "demo").resolve()
    assert Path(raw["run_dir"]) == (work / "runs" / "demo").resolve()
    assert (work / "runs" / "demo" / "logs" / "planner.log").is_file()
