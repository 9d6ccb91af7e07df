"""Tests for the deterministic demo corpus generator (small scale, so they run in seconds)."""
from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from flight_overlord.core.vision import decode_patches, image_size, patch_grid
from flight_overlord.demo.data import SOURCE_NAMES, make_demo_data
from flight_overlord.demo.images import IMAGE_SOURCE_NAMES, make_image_demo_data

from ..helpers import DEMO_SCALE, DEMO_SEED


@pytest.fixture(scope="module")
def files(demo_corpus):
    """The session's demo corpus (tests/conftest.py: seed DEMO_SEED, scale DEMO_SCALE, images and
    tokenizer.json) as make_demo_data returned it: {source: [paths]}."""
    return demo_corpus.files


def _texts(paths) -> list[str]:
    return [t for p in paths for t in pq.read_table(p, columns=["text"])["text"].to_pylist()]


def _byte_lengths(paths) -> np.ndarray:
    return np.array([len(t.encode("utf-8")) for t in _texts(paths)])


def _rows(paths, column: str) -> list:
    return [v for p in paths for v in pq.read_table(p, columns=[column])[column].to_pylist()]


def test_sources_and_layout(files):
    assert tuple(files) == SOURCE_NAMES + IMAGE_SOURCE_NAMES
    assert SOURCE_NAMES == ("captions", "longdocs", "code", "docstrings", "manuals", "qa")
    assert IMAGE_SOURCE_NAMES == ("imagecaps", "interleaved")
    for name, paths in files.items():
        assert len(paths) >= 2, name
        for path in paths:
            assert path.parent.name == name and path.name.startswith("part-")
            meta = pq.ParquetFile(path).metadata
            assert meta.num_row_groups >= 2, path
            assert meta.row_group(0).column(0).compression == "ZSTD"
            schema = pq.read_schema(path)
            if name in SOURCE_NAMES:
                assert schema.names == ["text", "doc_id"]
                assert schema.field("text").type == pa.string()
            else:
                assert schema.names == ["texts", "images", "doc_id"]
                assert schema.field("texts").type == pa.list_(pa.string())
                assert schema.field("images").type == pa.list_(pa.binary())
            assert schema.field("doc_id").type == pa.int64()


def test_same_seed_is_byte_identical(files, tmp_path):
    # the Parquet files are compared
    again = make_demo_data(tmp_path, seed=DEMO_SEED, scale=DEMO_SCALE, tokenizer=False)
    assert tuple(again) == tuple(files)
    for name in files:
        assert [p.name for p in again[name]] == [p.name for p in files[name]]
        for a, b in zip(files[name], again[name]):
            assert a.read_bytes() == b.read_bytes(), (name, a.name)


def test_different_seed_differs(files, tmp_path):
    other = make_demo_data(tmp_path, seed=DEMO_SEED + 1, scale=DEMO_SCALE, tokenizer=False)
    for name in SOURCE_NAMES:
        assert _texts(other[name]) != _texts(files[name]), name
    for name in IMAGE_SOURCE_NAMES:
        assert _rows(other[name], "images") != _rows(files[name], "images"), name
        assert _rows(other[name], "texts") != _rows(files[name], "texts"), name


def test_doc_ids_unique_per_source(files):
    for name, paths in files.items():
        ids = [i for p in paths for i in pq.read_table(p, columns=["doc_id"])["doc_id"].to_pylist()]
        assert len(ids) == len(set(ids)), name


def test_texts_non_empty(files):
    for name in SOURCE_NAMES:
        assert min(_byte_lengths(files[name])) > 0, name


def test_captions_are_mostly_short_with_a_long_tail(files):
    lengths = _byte_lengths(files["captions"])
    assert np.mean(lengths <= 64) >= 0.95
    assert lengths.max() > 64


def test_longdocs_are_long(files):
    lengths = _byte_lengths(files["longdocs"])
    assert np.median(lengths) >= 1000
    assert lengths.min() >= 1000 and lengths.max() <= 8000


def test_source_distributions_differ(files):
    median = {name: np.median(_byte_lengths(files[name])) for name in SOURCE_NAMES}
    assert median["captions"] < median["qa"] < median["longdocs"]
    assert median["captions"] < median["code"] < median["longdocs"]


def test_qa_format(files):
    texts = _texts(files["qa"])
    assert all(t.startswith("Q: ") and "\nA: " in t for t in texts)


def test_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        make_demo_data(tmp_path, seed=-1, scale=DEMO_SCALE)
    with pytest.raises(ValueError):
        make_demo_data(tmp_path, scale=0)
    with pytest.raises(ValueError):
        make_image_demo_data(tmp_path, seed=-1, scale=DEMO_SCALE)


# ---------------------------------------------------------------------------------------------
# Image-text sources.
# ---------------------------------------------------------------------------------------------

def _documents(paths) -> list[tuple[list, list]]:
    return list(zip(_rows(paths, "texts"), _rows(paths, "images")))


def _images(paths) -> list[bytes]:
    return [image for _, images in _documents(paths) for image in images if image is not None]


def test_interleaved_layout(files):
    for name in IMAGE_SOURCE_NAMES:
        docs = _documents(files[name])
        assert len(docs) >= 16, name
        for texts, images in docs:
            assert len(texts) == len(images) >= 2
            assert all((t is None) != (i is None) for t, i in zip(texts, images)), (texts, images)
            assert all(t for t in texts if t is not None) and all(i for i in images if i is not None)


def test_imagecaps_is_image_then_caption(files):
    for texts, images in _documents(files["imagecaps"]):
        assert texts[0] is None and images[1] is None and len(texts) == 2
        assert 3 <= len(texts[1]) <= 200, texts[1]


def test_interleaved_documents(files):
    counts = []
    for texts, images in _documents(files["interleaved"]):
        paragraphs = [t for t in texts if t is not None]
        counts.append((len(paragraphs), len(texts) - len(paragraphs)))
        assert all(100 <= len(t.encode("utf-8")) <= 1500 for t in paragraphs)
    n_texts, n_images = zip(*counts)
    assert min(n_texts) >= 2 and max(n_texts) <= 8 and min(n_images) >= 2 and max(n_images) <= 6
    assert len(set(n_images)) > 2                               # varied, not a constant


def test_images_decode_and_agree_with_headers(files):
    for name in IMAGE_SOURCE_NAMES:
        formats = set()
        for data in _images(files[name]):
            formats.add(Image.open(io.BytesIO(data)).format)
            patches, grid = decode_patches(data)
            assert grid == patch_grid(*image_size(data)) and patches.shape[0] == grid[1] * grid[2]
        assert formats == {"JPEG", "PNG"}, name


def test_image_resolutions_are_skewed(files):
    long_side = {name: np.array([max(image_size(d)) for d in _images(files[name])]) for name in IMAGE_SOURCE_NAMES}
    caps, inter = long_side["imagecaps"], long_side["interleaved"]
    assert np.median(caps) <= 160 and caps.max() >= 600 and caps.min() >= 32
    assert np.mean(caps <= 160) >= 0.6 and np.mean(caps > 600) <= 0.15
    assert np.median(caps) < np.median(inter) and inter.max() >= 700 and inter.max() <= 1400


def test_image_demo_data_alone_matches(files, tmp_path):
    alone = make_image_demo_data(tmp_path, seed=DEMO_SEED, scale=DEMO_SCALE)
    assert tuple(alone) == IMAGE_SOURCE_NAMES
    for name, paths in alone.items():
        assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in files[name]], name


def test_images_can_be_left_out(tmp_path):
    made = make_demo_data(tmp_path, seed=DEMO_SEED, scale=DEMO_SCALE, images=False, tokenizer=False)
    assert tuple(made) == SOURCE_NAMES
    assert not (tmp_path / "imagecaps").exists()
