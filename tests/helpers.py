"""Helpers shared by the test modules: configs over the test corpus, and reading runs back."""
from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pyarrow as pa
import yaml
from PIL import Image

from flight_overlord import harness
from flight_overlord.config import load_config
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.harness import step_digest
from flight_overlord.journal import read_journal
from flight_overlord.planner.audit import plan_records

DEMO_SEED, DEMO_SCALE = 0, 0.03  # the session's demo corpus (tests/conftest.py)
WEIGHTS = {"captions": 0.15, "longdocs": 0.25, "code": 0.20, "docstrings": 0.15, "manuals": 0.15, "qa": 0.10}


def write_config(directory: pathlib.Path, corpus: pathlib.Path, *, loaders: dict | None = None,
                 **overrides) -> pathlib.Path:
    """A small run config over ``corpus``; ``overrides`` replace top-level keys."""
    loaders = loaders or {}
    raw = {
        "seed": 7,
        "data_root": str(corpus),
        "run_dir": str(directory / "run"),
        "sources": [{"name": n, "paths": f"{n}/*.parquet", "weight": w, "loaders": loaders.get(n, 1)}
                    for n, w in WEIGHTS.items()],
        "mesh": {"dp": 2},
        "global_batch": {"context_length": 1024, "microbatches": 2, "tokens_per_step": 3600},
        "balance": {"method": "greedy"},
        "prefetch": 2,
    }
    raw.update(overrides)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def assert_round_trip(original, make_fresh, advance) -> None:
    """``state_dict`` is JSON-able; a fresh object loaded with it has the same state, and stays equal
    to the original through the same further steps."""
    state = json.loads(json.dumps(original.state_dict()))
    restored = make_fresh()
    restored.load_state_dict(state)
    assert json.loads(json.dumps(restored.state_dict())) == state
    for _ in range(3):
        advance(original)
        advance(restored)
        assert json.loads(json.dumps(restored.state_dict())) == json.loads(json.dumps(original.state_dict()))


ONE_RANK_BATCH = {"context_length": 512, "microbatches": 2, "tokens_per_step": 800}


def one_rank_config(directory: pathlib.Path, corpus: pathlib.Path) -> pathlib.Path:
    """A one-rank run (dp 1) of 2 microbatches of 512 tokens, so a test drives its only trainer alone."""
    return write_config(directory, corpus, mesh={"dp": 1}, global_batch=ONE_RANK_BATCH)


EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def run_example(planner: str, script: str, *args: str, nproc: int | None = 2, expect_ok: bool = True) -> str:
    """``examples/SCRIPT`` as a user runs it against ``planner``: under torchrun with ``nproc`` ranks
    (None: one plain process); its stdout, after checking it exits 0 (or, ``expect_ok=False``, not)."""
    env = {**os.environ, "OVERLORD_PLANNER": planner, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    launcher = [] if nproc is None else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    out = subprocess.run([sys.executable, *launcher, str(EXAMPLES / script), *args], env=env, capture_output=True,
                         text=True, timeout=240)
    if expect_ok:
        assert out.returncode == 0, f"{script} exited {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    else:
        assert out.returncode != 0, out.stdout[-2000:]
    return out.stdout


IMAGE_SOURCES = [  # image-text sources of the demo corpus, and a text one
    {"name": "imagecaps", "paths": "imagecaps/*.parquet", "text_column": "texts", "image_column": "images",
     "weight": 0.4},
    {"name": "interleaved", "paths": "interleaved/*.parquet", "text_column": "texts", "image_column": "images",
     "weight": 0.4},
    {"name": "captions", "paths": "captions/*.parquet", "weight": 0.2},
]
IMAGE_BATCH = {"context_length": 2048, "microbatches": 2, "tokens_per_step": 6000}


def image_graph_config(directory: pathlib.Path, corpus, **overrides) -> pathlib.Path:
    """The image-text sources with an image graph: the images balanced over every rank for the vision
    encoder (``Strategy.images()``), the sequences over the data-parallel ranks."""
    (directory / "vlm.py").write_text(
        "def build(s):\n"
        "    s.cost('attention').distribute('DP').balance('greedy')\n"
        "    s.images().cost('patches').distribute('WORLD').balance('karmarkar_karp')\n"
        "    return s\n")
    return write_config(directory, corpus, sources=IMAGE_SOURCES, global_batch=IMAGE_BATCH, strategy="vlm.py",
                        mesh={"dp": 2, "tp": 2}, vision={"max_pixels": 200704}, **overrides)


STEPS = 12


def fetch_run(config_path, steps: int = STEPS) -> dict[int, list[pa.Table]]:
    """Bring a deployment up, read ``steps`` steps for every rank (as trainers read them), tear it down."""
    with LocalCluster(config_path) as cluster:
        return harness.fetch_steps(cluster.planner, load_config(config_path).mesh.world_size, 0, steps, timeout=60)


def each_rank(train, planner: str, ranks: int, timeout: float = 120) -> None:
    """``train(planner, rank)`` for every rank at once, one thread each (trainers run concurrently); a
    rank's error fails the test."""
    harness.each_rank(lambda rank: train(planner, rank), ranks, timeout=timeout)


def journal_records(config_path) -> list[dict]:
    """Every record of a run's plan journal, read as the package reads it: a line the Planner is
    writing right now (torn) is left out."""
    return [record for _, record in read_journal(load_config(config_path).run_dir / "plan-journal.jsonl")]


def journal(config_path) -> list[dict]:
    """The plans of a run, in journal order, each re-derived (bins, samples) and checked against the
    digest it was journaled with (trainer reports and other records are journaled too)."""
    return plan_records(load_config(config_path).run_dir, str(config_path))


def delivered_keys(tables: list[pa.Table]) -> list[str]:
    return [k for t in tables for keys in t.column("sample_keys").to_pylist() for k in keys]


def sample_lengths(tables: list[pa.Table]):
    """(key, tokens) of every delivered sample, from cu_seqlens."""
    for t in tables:
        for keys, cu in zip(t.column("sample_keys").to_pylist(), t.column("cu_seqlens").to_pylist()):
            yield from zip(keys, np.diff(cu).tolist())


def qwen2_vl_convert_to_rgb(im: Image.Image, background=(255, 255, 255)) -> Image.Image:
    """transformers' ``image_transforms.convert_to_rgb`` for a PIL image (background white there),
    written out here: an image with an alpha band or a transparency key goes to RGBA and is
    alpha-composited over an opaque canvas, the rest is ``convert("RGB")``."""
    if "A" in im.getbands() or im.info.get("transparency") is not None:
        im = im.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", im.size, (*background, 255)), im).convert("RGB")
    return im.convert("RGB")


def assert_every_planned_sample_once(planner: str, config_path, steps: int = 6, credentials=None) -> None:
    """The run is unharmed: every rank fetches ``steps`` steps, and every sample the journal planned
    for them arrives exactly once."""
    ranks = load_config(config_path).mesh.world_size
    run = harness.fetch_steps(planner, ranks, 0, steps, timeout=60, credentials=credentials)
    delivered = [k for tables in run.values() for k in delivered_keys(tables)]
    planned = [k for record in journal(config_path)[:steps] for b in record["bins"] for k in b]
    assert sorted(delivered) == sorted(planned) and len(set(delivered)) == len(delivered)


def losses(table: pa.Table) -> dict[str, float]:
    """A deterministic stand-in for a model's per-source loss (for dynamic mixing)."""
    out: dict[str, list[float]] = {}
    for keys, cu in zip(table.column("sample_keys").to_pylist(), table.column("cu_seqlens").to_pylist()):
        for key, n in zip(keys, np.diff(cu)):
            out.setdefault(key.split(":", 1)[0], []).append(math.log1p(int(n)))
    return {s: sum(v) / len(v) for s, v in out.items()}


def train(planner: str, start: int, end: int, *, ranks: int = 2, report: bool = False,
          on_step=None) -> dict[int, list]:
    """One trainer thread per rank, each through TrainerClient (retries, prefetch), steps [start, end):
    per rank, (step, its digest) of each step; ``report``: per-source losses sent back (dynamic mixing)."""
    def on_table(rank, client, table):
        step = table.column("step")[0].as_py()
        if report:
            client.report(step, losses(table))
        if on_step is not None:
            on_step(rank, step)
        return step, step_digest(table)
    return harness.train(planner, ranks, start, end, on_table=on_table)
