"""A hand-made constructor setting for the unit tests of ``constructor/``: a config of three sources
and two data-parallel ranks, one step's plan for constructor 0, and loader answers as loaders send them."""
from __future__ import annotations

import pyarrow as pa

from flight_overlord.config import parse_config
from flight_overlord.constructor.fetched import fetch_groups, in_plan_order, received
from flight_overlord.wire.plan import ConstructorPlan, FetchGroup
from flight_overlord.wire.schemas import load_schema

HOST_AB, HOST_C = "grpc://127.0.0.1:1", "grpc://127.0.0.1:2"  # two loader processes (never called here)
TOKENS = {"a:0": [1, 2, 3, 4, 5], "b:0": [6, 7, 8], "c:0": [9, 10, 11, 12], "c:1": [13, 14]}


def make_cfg(tmp_path, **overrides):
    for name in "abc":
        (tmp_path / f"{name}.parquet").write_bytes(b"")
    return parse_config({"seed": 1, "run_dir": str(tmp_path / "run"), "data_root": str(tmp_path),
                         "sources": [{"name": n, "paths": f"{n}.parquet"} for n in "abc"], "mesh": {"dp": 2},
                         "global_batch": {"context_length": 16, "microbatches": 2, "tokens_per_step": 40},
                         **overrides}, base_dir=tmp_path)


def plan(step: int = 0, lengths=(5, 3, 3, 2)) -> ConstructorPlan:
    """Bucket 0: microbatch 0 holds a:0 and b:0, microbatch 1 c:0 (cut to 3 tokens) and c:1. Sources
    a and b are served by one loader process, c by another."""
    keys = list(TOKENS)
    fetch = [FetchGroup("a", 0, [HOST_AB], [0], [[0, "a.parquet", 0, 0, 1]]),
             FetchGroup("c", 0, [HOST_C], [2, 3], [[0, "c.parquet", 0, 0, 1], [0, "c.parquet", 0, 1, 1]]),
             FetchGroup("b", 0, [HOST_AB], [1], [[0, "b.parquet", 0, 0, 1]])]
    return ConstructorPlan(step, "DP", [], 16, keys, list(lengths), {0: [[0, 1], [2, 3]]}, fetch)


def loader_answer(keys: list[str]) -> pa.Table:
    """A loader's samples table for ``keys`` (text: no images)."""
    return pa.table({"key": keys, "tokens": [TOKENS[k] for k in keys], "images": [[] for _ in keys],
                     "image_grids": [[] for _ in keys], "loss_mask": [[] for _ in keys]}, schema=load_schema("samples"))


def answer_of(p: ConstructorPlan, groups: list[FetchGroup]) -> pa.Table:
    """The loaders' answer to one samples call of ``p``: the groups' samples back to back."""
    return loader_answer([p.keys[i] for g in groups for i in g.items])


def fetched(cfg, p: ConstructorPlan) -> dict:
    """``p``'s samples as the loaders answer them, decoded, in plan order."""
    calls = fetch_groups(p)
    return in_plan_order(p, calls, [received(cfg, p.step, p, groups, answer_of(p, groups)) for groups in calls])
