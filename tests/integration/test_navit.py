"""The navit-like config (configs/vlm_navit.yaml: 12 image-text sources, the hybrid VLM program) on
a real cluster, audited with a stock Flight client: every planned sample delivered exactly once per
step, each image's placeholder run as long as its Parquet header says, every image encoded exactly
once over the ranks, and the sources delivered as planned."""
from __future__ import annotations

import collections
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from flight_overlord.client import StepFetcher
from flight_overlord.client.trainer import table_to_encoder_inputs, table_to_microbatches
from flight_overlord.config import load_config
from flight_overlord.core.vision import image_size, patch_grid
from flight_overlord.demo.navit import make_navit
from flight_overlord.deploy.launch import LocalCluster

from ..helpers import journal

STEPS = 3
CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "vlm_navit.yaml"


def read_run(planner: str, steps: int, ranks: int) -> dict[tuple[str, int, int], pa.Table]:
    """(kind, step, rank) -> the table, for the batches and the encoder inputs of every rank."""
    fetchers = [StepFetcher(planner, rank, timeout=120) for rank in range(ranks)]
    try:
        return {(kind, step, rank): fetchers[rank].fetch(step, kind)
                for step in range(steps) for rank in range(ranks) for kind in ("batch", "encoder")}
    finally:
        for fetcher in fetchers:
            fetcher.close()


@pytest.fixture(scope="module")
def navit_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("navit")
    # 96 rows a source: no source wraps into its next epoch within STEPS (a sample key names no epoch, so a
    # wrap would repeat keys within a step, which this test reads as a duplicate)
    make_navit(root / "data", 12, rows_per_source=96)
    raw = yaml.safe_load(CONFIG.read_text())
    raw.update(data_root=str(root / "data"), run_dir=str(root / "run"),
               strategy={**raw["strategy"], "file": str(CONFIG.parent / raw["strategy"]["file"])})
    path = root / "vlm_navit.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    with LocalCluster(path) as cluster:
        run = read_run(cluster.planner, STEPS, cfg.mesh.world_size)
    return cfg, path, root / "data", run


def _row(data: pathlib.Path, key: str):
    source, file, row_group, row = key.split(":")
    table = pq.ParquetFile(data / file).read_row_group(int(row_group))
    return [b for b in table.column("images")[int(row)].as_py() if b is not None]


def _runs(mask: np.ndarray) -> list[int]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [int(b - a) for a, b in zip(edges[::2], edges[1::2])]


def test_every_sample_once_with_its_images_encoded_once(navit_run):
    cfg, path, data, run = navit_run
    mesh, spec = cfg.mesh, cfg.vision.spec
    plans = journal(path)[:STEPS]
    sources = collections.Counter()
    for step, plan in enumerate(plans):
        planned = [k for b in plan["bins"] for k in b]
        delivered, images = [], collections.Counter()
        for rank in range(mesh.world_size):
            if mesh.coord(rank).tp:
                continue  # TP peers get what their TP rank 0 gets (broadcast_at TP)
            for mb in table_to_microbatches(run[("batch", step, rank)]):
                ids, cu = mb["input_ids"].numpy(), mb["cu_seqlens"].numpy()
                for key, start, end in zip(mb["sample_keys"], cu[:-1], cu[1:]):
                    delivered.append(key)
                    runs = _runs(ids[start:end] == cfg.vision.image_token_id)
                    headers = _row(data, key)[:len(runs)]  # a cut sample keeps its first images whole
                    assert runs == [int(np.prod(patch_grid(*image_size(b), spec))) // spec.merge_size ** 2
                                    for b in headers], key
                    images.update((key, i) for i in range(len(runs)))
        assert sorted(delivered) == sorted(planned) and len(set(delivered)) == len(delivered)
        encoded = collections.Counter()
        for rank in range(mesh.world_size):
            for image in table_to_encoder_inputs(run[("encoder", step, rank)]):
                encoded[(image["sample_key"], image["image_index"])] += 1
                assert not image["pixel_values"].numpy().any()  # the corpus's blank PNGs, decoded
        assert encoded == images and len(images) > 4
        sources.update(k.split(":")[0] for k in delivered)
        per_source = [collections.Counter(k.split(":")[0] for k in keys) for keys in (planned, delivered)]
        assert per_source[0] == per_source[1]
    assert len(sources) >= 6  # a mixture over the sources, not one of them
