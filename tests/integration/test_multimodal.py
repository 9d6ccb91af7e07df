"""Image-text sources end to end: real Parquet with real JPEG/PNG bytes, real Flight servers."""
from __future__ import annotations

import collections
import io
import pathlib
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest
from PIL import Image

from flight_overlord import wire
from flight_overlord.client import StepFetcher, TrainerClient
from flight_overlord.client.trainer import table_to_encoder_inputs, table_to_microbatches
from flight_overlord.config import load_config
from flight_overlord.core.vision import VisionSpec, unpatchify
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.wire.schemas import ENCODER_BATCH, MICROBATCH, load_schema

from ..helpers import IMAGE_BATCH, IMAGE_SOURCES, image_graph_config, qwen2_vl_convert_to_rgb, write_config

STEPS = 4
IMAGE_TOKEN, VISION_START, VISION_END = 256, 257, 258


def run(path, steps=STEPS, encoder=False):
    cfg = load_config(path)
    with LocalCluster(path) as cluster:
        fetchers = [StepFetcher(cluster.planner, r, timeout=60) for r in range(cfg.mesh.world_size)]
        batches, encoders = {r: [] for r in range(len(fetchers))}, {r: [] for r in range(len(fetchers))}
        for step in range(steps):  # in lock-step, as trainers go
            for r, f in enumerate(fetchers):
                batches[r].append(f.fetch(step))
                if encoder:
                    encoders[r].append(f.fetch(step, "encoder"))
        for f in fetchers:
            f.close()
    return batches, encoders


def source_row(corpus, key):
    source, file, rg, row = key.split(":")
    table = pq.ParquetFile(corpus / file).read_row_group(int(rg))
    return table.column("texts")[int(row)].as_py(), table.column("images")[int(row)].as_py()


def direct_decode(data: bytes, grid, spec: VisionSpec) -> np.ndarray:
    _, gh, gw = grid
    with Image.open(io.BytesIO(data)) as im:
        rgb = qwen2_vl_convert_to_rgb(im, spec.background)  # transparent images onto white, as Qwen2-VL
        return np.asarray(rgb.resize((gw * spec.patch_size, gh * spec.patch_size), Image.Resampling.BICUBIC))


@pytest.fixture(scope="module", params=["constructor", "loader"])
def image_run(request, corpus, tmp_path_factory):
    path = write_config(tmp_path_factory.mktemp(f"vlm-{request.param}"), corpus, sources=IMAGE_SOURCES,
                        global_batch=IMAGE_BATCH, vision={"decode_at": request.param, "max_pixels": 200704})
    batches, _ = run(path)
    return path, batches


def test_pixels_placeholders_and_labels(image_run, corpus):
    """Decoded pixels equal a direct Pillow decode; each image is one whole placeholder run of
    patches/merge^2 tokens inside its sample; labels are the next token of the same sample, -100
    on image targets, sample ends and padding."""
    path, batches = image_run
    cfg = load_config(path)
    spec = VisionSpec(cfg.vision.patch_size, cfg.vision.merge_size, cfg.vision.min_pixels, cfg.vision.max_pixels)
    checked_images = 0
    for tables in batches.values():
        for table in tables:
            for mb in table_to_microbatches(table):
                ids, labels = mb["input_ids"].numpy(), mb["labels"].numpy()
                cu = mb["cu_seqlens"].numpy()
                grids = mb["image_grid_thw"].numpy()
                pixels = mb["pixel_values"].numpy() if mb["pixel_values"] is not None else np.zeros((0, 588), np.uint8)
                assert pixels.shape[0] == int(grids.prod(axis=1).sum())
                image, row = 0, 0
                for key, start, end in zip(mb["sample_keys"], cu[:-1], cu[1:]):
                    sample = ids[start:end]
                    if not key.startswith(("imagecaps", "interleaved")):
                        assert not (sample == IMAGE_TOKEN).any()
                        continue
                    texts, images = source_row(corpus, key)
                    runs = _runs(sample == IMAGE_TOKEN)  # the row's first images: truncation drops whole ones
                    assert len(runs) <= len([b for b in images if b is not None]), key
                    for (run_start, run_len), data in zip(runs, [b for b in images if b is not None]):
                        grid = grids[image]
                        assert run_len == grid.prod() // spec.merge_size ** 2, key  # whole run, right length
                        assert sample[run_start - 1] == VISION_START and sample[run_start + run_len] == VISION_END
                        n = int(grid.prod())
                        delivered = unpatchify(pixels[row:row + n], tuple(grid), spec)
                        assert np.array_equal(delivered, direct_decode(data, grid, spec)), key
                        image, row, checked_images = image + 1, row + n, checked_images + 1
                    # labels: next token of the same sample, never an image placeholder
                    want = np.append(sample[1:], -100).astype(np.int32)
                    want[want == IMAGE_TOKEN] = -100
                    assert np.array_equal(labels[start:end], want), key
                assert image == len(grids)
                assert (labels[cu[-1]:] == -100).all() and np.array_equal(mb["loss_mask"].numpy(), labels != -100)
    assert checked_images > 10


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2])]


def test_truncation_never_splits_an_image_run(corpus, tmp_path):
    """A context shorter than many interleaved documents: samples are cut before an image that
    does not fit whole."""
    path = write_config(tmp_path, corpus, sources=IMAGE_SOURCES[1:2], prefetch=1,
                        global_batch={"context_length": 256, "microbatches": 2, "tokens_per_step": 400})
    batches, _ = run(path, steps=3)
    for table in batches[0] + batches[1]:
        for mb in table_to_microbatches(table):
            ids, cu, grids = mb["input_ids"].numpy(), mb["cu_seqlens"].numpy(), mb["image_grid_thw"].numpy()
            runs = [(s + a, n) for s, e in zip(cu[:-1], cu[1:]) for a, n in _runs(ids[s:e] == IMAGE_TOKEN)]
            assert [n for _, n in runs] == [int(g.prod()) // 4 for g in grids]
            assert all(ids[a - 1] == VISION_START and ids[a + n] == VISION_END for a, n in runs)


def _bad_image_source(directory, corpus):
    """imagecaps' first file with two rows broken: non-image bytes (caught from the header, at the
    loader) and a truncated JPEG (valid header, caught when decoded)."""
    first = sorted((corpus / "imagecaps").glob("*.parquet"))[0]
    table = pq.read_table(first)
    images = table.column("images").to_pylist()
    jpeg = max((i for i, row in enumerate(images) if i > 0 and row[0][:2] == b"\xff\xd8"),
               key=lambda i: len(images[i][0]))
    images[0] = [b"this is not an image", None]
    images[jpeg] = [images[jpeg][0][: len(images[jpeg][0]) // 2], None]
    out = directory / "bad" / "part-00000.parquet"
    out.parent.mkdir(parents=True)
    pq.write_table(table.set_column(table.schema.get_field_index("images"), "images",
                                    pa.array(images, pa.list_(pa.binary()))), out, row_group_size=table.num_rows)
    return out, f"bad:{out}:0:0", f"bad:{out}:0:{jpeg}"


@pytest.mark.parametrize("policy", ["skip", "fail"])
def test_bad_images_follow_the_policy(corpus, tmp_path, policy):
    out, header_key, truncated_key = _bad_image_source(tmp_path, corpus)
    sources = [{"name": "bad", "paths": str(out), "text_column": "texts", "image_column": "images", "weight": 1.0}]
    rows = pq.ParquetFile(out).metadata.num_rows
    path = write_config(tmp_path, corpus, sources=sources, mesh={"dp": 1}, prefetch=1,
                        global_batch={"context_length": 2048, "microbatches": 1, "tokens_per_step": 1},
                        vision={"on_bad_image": policy, "max_pixels": 200704})
    cfg = load_config(path)
    with LocalCluster(path) as cluster:
        fetcher = StepFetcher(cluster.planner, 0, timeout=30)
        if policy == "skip":
            keys = [k for s in range(rows - 1) for k in fetcher.fetch(s).column("sample_keys")[0].as_py()]
            assert header_key not in keys and truncated_key not in keys
            assert len(keys) == rows - 2 and len(set(keys)) == len(keys)  # every other sample, once
            info = fetcher.planner.get_flight_info(fl.FlightDescriptor.for_path("batch", "0", "0"))
            status = wire.call(fl.connect(info.endpoints[0].locations[0].uri.decode()), "status", {})
            assert status["bad_samples"] == [truncated_key]
        else:
            with pytest.raises(Exception, match="bad:.*(not an image|truncated)"):
                for s in range(rows):
                    fetcher.fetch(s)
        fetcher.close()
    logs = "".join(p.read_text() for p in (cfg.run_dir / "logs").glob("*.log"))
    assert f"sample {header_key}: image 0: not an image" in logs
    if policy == "skip":
        assert f"sample {truncated_key}: truncated JPEG" in logs


@pytest.fixture(scope="module")
def graph_run(corpus, tmp_path_factory):
    """An image-graph run read per step, ``("batch" | "encoder", STEP, RANK)``, in lock-step."""
    path = image_graph_config(tmp_path_factory.mktemp("graph"), corpus)
    return path, *run(path, encoder=True)


def test_image_graph_encodes_every_image_once_where_planned(graph_run, corpus):
    """Strategy.images(): the images are balanced over every rank for the encoder; each image of
    each delivered sample reaches exactly one rank's encoder stream, with its owner's position,
    and its pixels are the source image's."""
    path, batches, encoders = graph_run
    cfg = load_config(path)
    spec = VisionSpec(max_pixels=200704)
    for step in range(STEPS):
        expected, owners = collections.Counter(), {}
        for rank in (0, 2):  # the first rank of each data-parallel bucket (tp 0)
            for mb in table_to_microbatches(batches[rank][step]):
                assert mb["pixel_values"] is None  # pixels go to the encoder streams instead
                ids, cu = mb["input_ids"].numpy(), mb["cu_seqlens"].numpy()
                for key, start, end in zip(mb["sample_keys"], cu[:-1], cu[1:]):
                    n = len(_runs(ids[start:end] == IMAGE_TOKEN))  # the images the sample kept
                    expected.update((key, i) for i in range(n))
                    owners[key] = (mb["bucket"], mb["microbatch"])
        encoded = collections.Counter()
        for rank in range(cfg.mesh.world_size):
            for image in table_to_encoder_inputs(encoders[rank][step]):
                encoded[(image["sample_key"], image["image_index"])] += 1
                assert owners[image["sample_key"]] == (image["owner_bucket"], image["owner_microbatch"])
                data = [b for b in source_row(corpus, image["sample_key"])[1] if b is not None][image["image_index"]]
                grid = tuple(image["image_grid_thw"][0].tolist())
                assert np.array_equal(unpatchify(image["pixel_values"].numpy(), grid, spec),
                                      direct_decode(data, grid, spec))
        assert encoded == expected and len(expected) > 4


def test_encoder_rank_streams_for_stock_clients_and_trainer_clients(graph_run, corpus, tmp_path):
    """Under an image graph, ``list_flights`` names every rank's two streams, ``('rank', RANK)`` and
    ``('encoder-rank', RANK)``; a stock client reading them chunk by chunk (one record batch per step,
    an empty one when the rank encodes no image) and ``TrainerClient(encoder=True)`` (both streams)
    get exactly the tables of the per-step tickets of the same config and seed."""
    _, batches, encoders = graph_run
    path = image_graph_config(tmp_path, corpus)
    got = {r: {"batch": [], "encoder": []} for r in range(4)}
    errors: list[BaseException] = []

    def stock(rank: int, planner: str) -> None:
        client = fl.connect(planner)
        for kind, schema in (("rank", MICROBATCH), ("encoder-rank", ENCODER_BATCH)):
            info = client.get_flight_info(fl.FlightDescriptor.for_path(kind, str(rank), "0", str(STEPS)))
            assert info.schema.equals(load_schema(schema))
            endpoint = info.endpoints[0]
            reader = fl.connect(endpoint.locations[0].uri.decode()).do_get(endpoint.ticket)
            got[rank]["batch" if kind == "rank" else "encoder"] = [pa.Table.from_batches([c.data]) for c in reader]
        client.close()

    def trainer(rank: int, planner: str) -> None:
        with TrainerClient(planner, rank, num_steps=STEPS, as_tensors=False, encoder=True, timeout=60) as client:
            for table, encoder in client:
                got[rank]["batch"].append(table)
                got[rank]["encoder"].append(encoder)

    def guarded(fn, *args) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # surfaced in the test's thread
            errors.append(exc)

    with LocalCluster(path) as cluster:
        deadline = time.monotonic() + 60
        while not (listed := [f.descriptor.path for f in fl.connect(cluster.planner).list_flights()
                              if f.descriptor.path[0] in (b"rank", b"encoder-rank")]):
            assert time.monotonic() < deadline, "list_flights never named the rank streams"
            time.sleep(0.2)
        assert sorted(listed) == sorted([kind, str(r).encode()] for r in range(4)
                                        for kind in (b"rank", b"encoder-rank"))
        threads = [threading.Thread(target=guarded, args=(stock if rank < 2 else trainer, rank, cluster.planner))
                   for rank in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors[0]
    for rank in range(4):
        assert len(got[rank]["batch"]) == len(got[rank]["encoder"]) == STEPS
        for step in range(STEPS):
            assert got[rank]["batch"][step].equals(batches[rank][step].combine_chunks()), (rank, step)
            assert got[rank]["encoder"][step].equals(encoders[rank][step].combine_chunks()), (rank, step)
    assert sum(t.num_rows for r in got for t in got[r]["encoder"]) > 4


def test_cutting_a_sample_drops_whole_images():
    from flight_overlord.config import parse_config
    from flight_overlord.constructor.assembly import Sample, truncate
    cfg = parse_config({"sources": [{"name": "x", "paths": "test_multimodal.py"}],
                        "global_batch": {"context_length": 64, "samples_per_step": 1}},
                       base_dir=pathlib.Path(__file__).parent)
    s, e, p = VISION_START, VISION_END, IMAGE_TOKEN
    tokens = np.array([1, 2, s, p, p, e, 3, s, p, p, p, p, e, 4, 5], dtype=np.int32)
    grids = np.array([1, 2, 4, 1, 4, 4], dtype=np.int32)  # 8 and 16 patches: 2 and 4 placeholders
    sample = Sample("k", tokens, np.arange(24 * 3, dtype=np.uint8).reshape(24, 3), grids)
    for length, kept_tokens, kept_images in [(15, 15, 2), (14, 14, 2), (12, 7, 1), (6, 6, 1), (5, 2, 0), (1, 1, 0)]:
        cut = truncate(sample, length, cfg)
        assert len(cut.tokens) == kept_tokens and len(cut.grids) == 3 * kept_images, length
        assert len(cut.patches) == [0, 8, 24][kept_images]
        assert (cut.tokens == p).sum() == [0, 2, 6][kept_images]
