"""What the README names runs, and runs again: ``scripts/demo.sh`` twice in a row, and every config
under ``configs/`` from the data ``overlord demo`` makes for it."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from flight_overlord.config import load_config
from flight_overlord.demo.run import ensure_demo_data, run_demo
from flight_overlord.planner.strategy import load_strategy

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*.yaml"))
CHEAP = {"demo_bpe.yaml", "vlm.yaml"}  # 2-4 ranks; the others spawn 8-16 trainer processes (demo.yaml: demo.sh)


def _demo_sh(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run([str(REPO / "scripts" / "demo.sh"), *args], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, f"demo.sh exited {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


def test_demo_sh_runs_twice_in_a_row(corpus, tmp_path):
    run_dir = tmp_path / "run"
    first = _demo_sh("--data", str(corpus), "--run-dir", str(run_dir), "--steps", "2")
    second = _demo_sh("--data", str(corpus), "--run-dir", str(run_dir), "--steps", "2")
    for out in (first, second):
        assert "summary" in out.stdout and "throughput" in out.stdout, out.stdout
    assert "moved the previous demo run aside" not in first.stdout
    (line,) = [line for line in second.stdout.splitlines() if line.startswith("moved the previous demo run aside to ")]
    aside = Path(line.rsplit(" ", 1)[1])
    assert aside.parent == run_dir.parent and (aside / "plan-journal.jsonl").is_file()
    assert (run_dir / "plan-journal.jsonl").is_file()


@pytest.fixture(scope="module")
def configs(corpus, tmp_path_factory) -> Path:
    """The repository's configs/ (strategies too) over a data root holding the session's demo corpus
    (linked) and nothing else: the long-tail sources are for ``overlord demo`` to make."""
    root = tmp_path_factory.mktemp("configs")
    data = root / "data"
    data.mkdir()
    for entry in corpus.iterdir():
        (data / entry.name).symlink_to(entry)
    shutil.copytree(REPO / "configs", root / "configs")
    for name in CONFIGS:
        path = root / "configs" / name
        raw = yaml.safe_load(path.read_text())
        raw.update(data_root=str(data), run_dir=str(root / "runs" / path.stem))
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return root / "configs"


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_loads_with_the_data_demo_makes_for_it(configs, name):
    ensure_demo_data(configs / name)
    cfg = load_config(configs / name)
    strategy = load_strategy(cfg)
    assert cfg.mesh.world_size >= 2 and strategy.mesh.world_size == cfg.mesh.world_size


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in CHEAP else pytest.mark.slow)
                                  for n in CONFIGS if n != "demo.yaml"])
def test_the_demo_of_every_config_runs_a_couple_of_steps_and_again(configs, name, capsys):
    runs = 2 if name == "demo_bpe.yaml" else 1  # a second run of a config's demo moves the first aside
    for _ in range(runs):
        summary = run_demo(configs / name, steps=2)
        assert summary["weights"] and sum(summary["realized"].values()) == pytest.approx(1.0)
    assert capsys.readouterr().out.count("moved the previous demo run aside to ") == runs - 1


def test_a_source_the_demo_cannot_make_is_named(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"data_root": "data", "sources": [{"name": "webcrawl", "paths": "webcrawl/*"}]}))
    with pytest.raises(SystemExit, match="webcrawl"):
        ensure_demo_data(config)
