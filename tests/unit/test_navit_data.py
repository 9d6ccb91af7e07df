"""The navit-like and coyo-like corpus generators: deterministic, and distributed as documented."""
from __future__ import annotations

import collections
import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from flight_overlord.core.vision import VisionSpec, decode_patches, image_size, num_patches, patch_grid
from flight_overlord.demo.navit import (
    KIND_SHARES,
    KINDS,
    blank_png,
    coyo_profiles,
    make_coyo,
    make_navit,
    navit_profiles,
    sample_layout,
    source_layouts,
)


def _rows(paths):
    return [row for p in paths for row in pq.read_table(p).to_pylist()]


def test_same_seed_same_bytes_other_seed_other_data(tmp_path):
    a = make_navit(tmp_path / "a", 4, seed=3, rows_per_source=16)
    b = make_navit(tmp_path / "b", 4, seed=3, rows_per_source=16)
    c = make_navit(tmp_path / "c", 4, seed=4, rows_per_source=16)
    assert list(a) == ["navit000", "navit001", "navit002", "navit003"]
    for name in a:
        assert [p.read_bytes() for p in a[name]] == [p.read_bytes() for p in b[name]]
    assert any([p.read_bytes() for p in a[n]] != [p.read_bytes() for p in c[n]] for n in a)
    coyo = make_coyo(tmp_path / "d", seed=3, rows_per_source=16)
    assert list(coyo) == [f"coyo{i}" for i in range(5)]
    again = make_coyo(tmp_path / "e", seed=3, rows_per_source=16)
    assert [p.read_bytes() for p in coyo["coyo2"]] == [p.read_bytes() for p in again["coyo2"]]


def test_rows_are_the_layouts_written_out(tmp_path):
    """What a file holds is exactly the drawn layout: text segments of the drawn byte length, PNGs
    whose header is the drawn size and which really decode to that grid."""
    written = make_navit(tmp_path, 6, seed=1, rows_per_source=16)
    profiles = navit_profiles(6, seed=1)
    for i, (name, paths) in enumerate(written.items()):
        layouts = source_layouts(profiles[i], 16, seed=1, offset=12_000, index=i)
        rows = _rows(paths)
        assert [r["doc_id"] for r in rows] == list(range(16))
        for row, layout in zip(rows, layouts):
            assert len(row["texts"]) == len(row["images"]) == len(layout)
            for text, image, (kind, value) in zip(row["texts"], row["images"], layout):
                if kind == "text":
                    assert image is None and len(text.encode()) == value
                else:
                    assert text is None and image_size(image) == value
    data = blank_png(300, 200)
    patches, grid = decode_patches(data)
    assert grid == patch_grid(300, 200) and patches.shape[0] == num_patches(grid) and not patches.any()
    assert len(blank_png(2000, 1500)) < 1000  # small on disk, whatever the size


def test_navit_sources_differ_as_documented():
    profiles = navit_profiles(306, seed=0)
    assert len(profiles) == 306 and len({p.name for p in profiles}) == 306
    kinds = collections.Counter(p.kind for p in profiles)
    for kind, share in zip(KINDS, KIND_SHARES):
        assert abs(kinds[kind] / 306 - share) < 0.08, kinds  # binomial: 3 sigma is ~0.085 at 0.5
    for p in profiles:
        low, high = {"caption": (160, 800), "interleaved": (200, 900), "document": (800, 2400)}[p.kind]
        assert low <= p.side_median <= high
        assert (p.extra_images == 0) == (p.kind == "caption")
    assert navit_profiles(306, seed=0) == profiles and navit_profiles(306, seed=1) != profiles


def _draws(profile, n, seed=0):
    rng = np.random.default_rng(seed)
    return [sample_layout(profile, rng) for _ in range(n)]


def test_navit_patch_counts_are_heavy_tailed_within_and_across_sources():
    profiles = navit_profiles(306, seed=0)
    spec = VisionSpec()
    medians = {}
    every = []
    for p in profiles[:60]:
        patches = [num_patches(patch_grid(*v, spec)) for d in _draws(p, 200) for k, v in d if k == "image"]
        medians[p.name] = np.median(patches)
        every += patches
        images = [sum(k == "image" for k, _ in d) for d in _draws(p, 200)]
        if p.kind == "caption":
            assert set(images) == {1}
        else:  # 1 + Poisson(extra): the mean within 4 standard errors
            assert abs(np.mean(images) - 1 - p.extra_images) < 4 * math.sqrt(p.extra_images / 200) + 1e-9
    assert max(medians.values()) / min(medians.values()) > 20  # across sources
    every = np.array(every)
    assert np.percentile(every, 90) / np.median(every) > 3  # within the mixture: a long tail


def test_interleaved_sources_mix_images_and_paragraphs():
    p = next(p for p in navit_profiles(306) if p.kind == "interleaved")
    for layout in _draws(p, 50):
        kinds = [k for k, _ in layout]
        assert kinds.count("text") == kinds.count("image") + 1


def test_coyo_captions_match_the_papers_skew():
    """coyo700m (the paper's Sec. 2.3): 98.23 % of captions <= 64 tokens, the longer ones ~9.3 % of tokens."""
    lengths = np.array([v for p in coyo_profiles() for d in _draws(p, 4000) for k, v in d if k == "text"])
    assert 0.965 < (lengths <= 64).mean() < 0.995
    assert 0.05 < lengths[lengths > 64].sum() / lengths.sum() < 0.14
    for p in coyo_profiles():
        assert all([k for k, _ in d] == ["image", "text"] for d in _draws(p, 50))


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_arguments_are_named(tmp_path, bad):
    with pytest.raises(ValueError, match="navit sources"):
        navit_profiles(bad)
    with pytest.raises(ValueError, match="rows per source"):
        make_coyo(tmp_path, rows_per_source=3)


def test_the_command_writes_navit_and_coyo_and_names_bad_counts(tmp_path, capsys):
    from flight_overlord.deploy.cli import main
    main(["make-demo-data", str(tmp_path), "--navit", "2", "--rows-per-source", "16"])
    main(["make-demo-data", str(tmp_path), "--coyo", "--rows-per-source", "16"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"coyo{i}" for i in range(5)] + ["navit000", "navit001"]
    assert "navit001: 2 files" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--navit: the number of navit sources must be a positive integer, got 0"):
        main(["make-demo-data", str(tmp_path), "--navit", "0"])
