"""Tests for flight_overlord.core.vision on real images encoded with Pillow here."""
from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFile, features

from flight_overlord.core.vision import (FORMATS, ImageError, VisionSpec, decode_patches, image_patch_counts,
                                    image_size, patch_grid, placeholder_tokens, smart_resize, unpatchify)

SPECS = [VisionSpec(patch_size=p, merge_size=m) for p in (14, 16) for m in (1, 2)]
SIZES = [(1, 1), (10, 500), (500, 10), (13, 17), (28, 28), (57, 29), (101, 333), (640, 480)]
LARGE = (2000, 1500)                  # decoded in a few formats only: slow, and adds little after one
FORMAT_MODES = [("JPEG", "RGB"), ("JPEG", "L"), ("PNG", "RGB"), ("PNG", "RGBA"), ("PNG", "P"), ("PNG", "L"),
                ("GIF", "P"), ("BMP", "RGB")]
if features.check("webp"):
    FORMAT_MODES += [("WEBP", "RGB"), ("WEBP", "RGBA")]
LARGE_FORMAT_MODES = [("JPEG", "RGB"), ("PNG", "RGBA"), ("PNG", "P")]


def encode(width: int, height: int, fmt: str = "JPEG", mode: str = "RGB", seed: int = 0) -> bytes:
    """A gradient with a few shapes: structured content, so the resize has edges to get right."""
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    y = np.linspace(0, 255, height, dtype=np.uint8)[:, None]
    base = np.stack(np.broadcast_arrays(x, y, x // 2 + y // 2), axis=-1)
    im = Image.fromarray(np.ascontiguousarray(base), "RGB")
    draw = ImageDraw.Draw(im)
    for _ in range(3):
        x0, y0 = int(rng.integers(width)), int(rng.integers(height))
        box = (x0, y0, x0 + int(rng.integers(1, width + 1)), y0 + int(rng.integers(1, height + 1)))
        draw.ellipse(box, fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    if mode == "P":
        im = im.quantize(64)
    elif mode != "RGB":
        im = im.convert(mode)
    buf = io.BytesIO()
    im.save(buf, fmt)
    return buf.getvalue()


def direct_decode(data: bytes, grid, spec: VisionSpec) -> np.ndarray:
    """What decode_patches must reproduce: Pillow decode, RGB, bicubic resize to the grid's size."""
    _, gh, gw = grid
    im = Image.open(io.BytesIO(data)).convert("RGB")
    return np.asarray(im.resize((gw * spec.patch_size, gh * spec.patch_size), Image.Resampling.BICUBIC))


@pytest.fixture(scope="module")
def images() -> dict[tuple, bytes]:
    cases = [(fmt, mode, w, h) for fmt, mode in FORMAT_MODES for w, h in SIZES]
    cases += [(fmt, mode, *LARGE) for fmt, mode in LARGE_FORMAT_MODES]
    return {(fmt, mode, w, h): encode(w, h, fmt, mode, seed=w * 7 + h) for fmt, mode, w, h in cases}


@pytest.fixture(scope="module")
def decoded(images) -> dict[tuple, tuple]:
    """decode_patches of every image under every spec, keyed by (image key, spec)."""
    return {(key, spec): decode_patches(data, spec) for key, data in images.items() for spec in SPECS}


def test_truncated_images_are_not_loaded_by_default():
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_header_size_and_patches_agree_with_decoding(images, decoded):
    for (fmt, mode, w, h), data in images.items():
        assert image_size(data) == (w, h), (fmt, mode)
        assert Image.open(io.BytesIO(data)).format == fmt
        for spec in SPECS:
            grid = patch_grid(w, h, spec)
            patches, decoded_grid = decoded[(fmt, mode, w, h), spec]
            assert decoded_grid == grid, (fmt, mode, w, h, spec)
            assert patches.dtype == np.uint8
            assert patches.shape == (grid[1] * grid[2], 3 * spec.patch_size ** 2)
            assert placeholder_tokens(grid, spec) * spec.merge_size ** 2 == patches.shape[0]


def test_patch_counts_from_headers(images, decoded):
    for spec in SPECS:
        counts = image_patch_counts(list(images.values()), spec)
        assert counts.dtype == np.int64
        assert counts.tolist() == [decoded[key, spec][0].shape[0] for key in images]


def test_unpatchify_equals_direct_pillow_decode(images, decoded):
    for key, data in images.items():
        for spec in SPECS:
            patches, grid = decoded[key, spec]
            assert np.array_equal(unpatchify(patches, grid, spec), direct_decode(data, grid, spec)), (key, spec)


def test_patch_order_matches_qwen2_vl():
    """The row layout of Qwen2-VL's processor (transformers, torch code written out in numpy), T = 1."""
    spec = VisionSpec()
    patches, (t, gh, gw) = decode_patches(encode(300, 200), spec)
    m, p = spec.merge_size, spec.patch_size
    image = unpatchify(patches, (t, gh, gw), spec).transpose(2, 0, 1)[None, None]      # (t, T, C, H, W)
    expected = (image.reshape(t, 1, 3, gh // m, m, p, gw // m, m, p)
                .transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(t * gh * gw, 3 * p * p))
    assert np.array_equal(patches, expected)
    # The first row is the top-left patch, the second its right neighbour (same merge window).
    top_left = image[0, 0, :, :p, :p].reshape(-1)
    right = image[0, 0, :, :p, p:2 * p].reshape(-1)
    below = image[0, 0, :, p:2 * p, :p].reshape(-1)
    assert np.array_equal(patches[0], top_left)
    assert np.array_equal(patches[1], right) and np.array_equal(patches[2], below)


def qwen2_vl_reference(height: int, width: int, factor: int, min_pixels: int, max_pixels: int):
    """transformers' smart_resize, written independently of the one under test."""
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        return max(factor, math.floor(height / beta / factor) * factor), max(factor, math.floor(width / beta / factor) * factor)
    if h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        return math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def test_smart_resize_known_values():
    spec = VisionSpec()                                   # factor 28, 3136..1003520 pixels
    assert smart_resize(28, 28, spec) == (56, 56)         # 784 < min_pixels: scaled up (x2), ceil
    assert smart_resize(1, 1, spec) == (56, 56)
    assert smart_resize(480, 640, spec) == (476, 644)     # 17.1 -> 17, 22.9 -> 23 (x28)
    assert smart_resize(10, 500, spec) == (28, 420)       # 10 rounds to 0: min branch, ceil(0.28), ceil(14.1)
    # 1500x2000 rounds to 1512x1988 = 3.0M px > max: beta = sqrt(3e6 / 1003520) = 1.729,
    # floor(1500 / 1.729 / 28) = 30, floor(2000 / 1.729 / 28) = 41
    assert smart_resize(1500, 2000, spec) == (840, 1148)
    assert smart_resize(1400, 1400, VisionSpec(patch_size=16)) == (992, 992)   # factor 32: floor(31.1)


def test_smart_resize_matches_reference_and_invariants():
    rng = np.random.default_rng(0)
    for spec in SPECS + [VisionSpec(min_pixels=256 * 28 * 28, max_pixels=1280 * 28 * 28)]:
        f = spec.factor
        for _ in range(2000):
            height, width = (int(v) for v in np.exp(rng.uniform(0, math.log(5000), 2)))
            if max(height, width) / min(height, width) > 200:
                with pytest.raises(ImageError, match="aspect ratio"):
                    smart_resize(height, width, spec)
                continue
            h, w = smart_resize(height, width, spec)
            assert (h, w) == qwen2_vl_reference(height, width, f, spec.min_pixels, spec.max_pixels)
            assert h % f == 0 and w % f == 0 and h >= f and w >= f
            if max(height, width) / min(height, width) <= 10:     # away from the factor clamps
                assert spec.min_pixels <= h * w <= spec.max_pixels, (height, width, h, w)
            if min(h, w) >= 10 * f:        # each side is off by < f from the exact scaling, < 10 %
                assert abs(math.log((w / h) / (width / height))) < 0.21, (height, width, h, w)
            assert patch_grid(width, height, spec) == (1, h // spec.patch_size, w // spec.patch_size)


def test_extreme_aspect_ratio_is_an_image_error():
    with pytest.raises(ImageError, match="aspect ratio"):
        patch_grid(1, 201, VisionSpec())
    data = encode(402, 2, "PNG")
    assert image_size(data) == (402, 2)
    with pytest.raises(ImageError, match="aspect ratio"):
        decode_patches(data)


@pytest.mark.parametrize("data", [b"", b"hello", b"\x89PNG\r\n", bytes(1000)])
def test_non_images_raise(data):
    with pytest.raises(ImageError, match="not an image"):
        image_size(data)
    with pytest.raises(ImageError, match="not an image"):
        decode_patches(data)
    with pytest.raises(ImageError):
        image_patch_counts([encode(20, 20), data])


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "BMP"])
@pytest.mark.parametrize("keep", [0.3, 0.6, 0.98])
def test_truncated_images_raise_on_decode(fmt, keep):
    data = encode(400, 300, fmt)
    cut = data[:int(len(data) * keep)]
    assert image_size(cut) == (400, 300)                  # the header survived: only decoding can tell
    with pytest.raises(ImageError, match=f"truncated {fmt}"):
        decode_patches(cut)


def test_truncated_jpeg_without_end_marker_raises():
    data = encode(64, 64, "JPEG")
    assert data.endswith(b"\xff\xd9")
    with pytest.raises(ImageError, match="truncated JPEG"):
        decode_patches(data[:-2])


def test_truncated_header_raises_from_image_size():
    with pytest.raises(ImageError):
        image_size(encode(64, 64, "PNG")[:20])


def test_refuses_to_decode_when_truncated_images_are_allowed(monkeypatch):
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(ImageError, match="LOAD_TRUNCATED_IMAGES"):
        decode_patches(encode(64, 64))


def test_restricted_formats():
    assert {"JPEG", "PNG"} <= set(FORMATS) and "EPS" not in FORMATS
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n"
    with pytest.raises(ImageError, match="not an image"):
        image_size(eps)


@pytest.mark.parametrize("kwargs, field", [
    ({"patch_size": 0}, "patch_size"), ({"patch_size": -14}, "patch_size"), ({"patch_size": 14.0}, "patch_size"),
    ({"merge_size": 0}, "merge_size"), ({"merge_size": True}, "merge_size"),
    ({"min_pixels": 0}, "min_pixels"), ({"min_pixels": -1}, "min_pixels"),
    ({"min_pixels": 1000, "max_pixels": 999}, "max_pixels"),
])
def test_bad_spec_raises_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"VisionSpec.{field}"):
        VisionSpec(**kwargs)


def test_spec_factor_and_unpatchify_checks_shape():
    assert VisionSpec().factor == 28 and VisionSpec(patch_size=16, merge_size=1).factor == 16
    patches, grid = decode_patches(encode(60, 60))
    with pytest.raises(ValueError, match="do not match"):
        unpatchify(patches[1:], grid)
