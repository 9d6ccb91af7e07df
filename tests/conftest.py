"""Shared fixtures: a small real demo corpus on disk and configs that point at it."""
from __future__ import annotations

import pathlib

import pytest
import yaml

from flight_overlord.demo_data import make_demo_data

WEIGHTS = {"captions": 0.15, "longdocs": 0.25, "code": 0.20, "docstrings": 0.15, "manuals": 0.15, "qa": 0.10}


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("corpus")
    make_demo_data(root, seed=0, scale=0.03)
    return root


def write_config(directory: pathlib.Path, corpus: pathlib.Path, *, loaders: dict | None = None, **overrides) -> pathlib.Path:
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
