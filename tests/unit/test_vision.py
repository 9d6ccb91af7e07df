"""Tests for flight_overlord.core.vision on real images encoded with Pillow here."""
from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFile, features

from flight_overlord.config import ConfigError, VisionConfig
from flight_overlord.config.parse import _parse_vision
from flight_overlord.core.vision import (
    ImageError,
    VisionSpec,
    check_image,
    decode_patches,
    image_patch_counts,
    image_size,
    open_formats,
    patch_grid,
    placeholder_tokens,
    smart_resize,
    unpatchify,
)
from flight_overlord.demo.images import _gen_imagecaps

from ..helpers import qwen2_vl_convert_to_rgb

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
    """What decode_patches did before transparency was composited, and must still give for opaque
    images bit for bit: Pillow decode, ``convert("RGB")``, bicubic resize to the grid's size."""
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
    """The fixture's images are all opaque (its RGBA ones have alpha 255 throughout)."""
    for key, data in images.items():
        for spec in SPECS:
            patches, grid = decoded[key, spec]
            assert np.array_equal(unpatchify(patches, grid, spec), direct_decode(data, grid, spec)), (key, spec)


def qwen2_vl_patchify(image: np.ndarray, spec: VisionSpec) -> np.ndarray:
    """The row layout of Qwen2-VL's processor (transformers, torch code written out in numpy), T = 1:
    an [H, W, 3] image -> [gh * gw, 3 * p * p]."""
    m, p = spec.merge_size, spec.patch_size
    gh, gw = image.shape[0] // p, image.shape[1] // p
    frames = image.transpose(2, 0, 1)[None, None]                                      # (t, T, C, H, W)
    return (frames.reshape(1, 1, 3, gh // m, m, p, gw // m, m, p)
            .transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(gh * gw, 3 * p * p))


def test_patch_order_matches_qwen2_vl():
    spec = VisionSpec()
    patches, (t, gh, gw) = decode_patches(encode(300, 200), spec)
    p = spec.patch_size
    image = unpatchify(patches, (t, gh, gw), spec).transpose(2, 0, 1)[None, None]      # (t, T, C, H, W)
    assert np.array_equal(patches, qwen2_vl_patchify(unpatchify(patches, (t, gh, gw), spec), spec))
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
        return (max(factor, math.floor(height / beta / factor) * factor),
                max(factor, math.floor(width / beta / factor) * factor))
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
    assert {"JPEG", "PNG"} <= set(open_formats()) and "EPS" not in open_formats()
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


# --- Transparency: Qwen2-VL's preprocessing composites onto white --------------------------------

WHITE = (255, 255, 255)


def qwen2_vl_preprocess(data: bytes, spec: VisionSpec, background=WHITE) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Qwen2-VL's image processor up to (not including) rescale/normalise and the temporal repeat:
    convert_to_rgb, smart_resize's size, PIL bicubic resize, patchify. Independent of the code
    under test except for Pillow itself."""
    with Image.open(io.BytesIO(data)) as im:
        rgb = qwen2_vl_convert_to_rgb(im, background)
    h, w = qwen2_vl_reference(rgb.height, rgb.width, spec.factor, spec.min_pixels, spec.max_pixels)
    pixels = np.asarray(rgb.resize((w, h), Image.Resampling.BICUBIC))
    return qwen2_vl_patchify(pixels, spec), (1, h // spec.patch_size, w // spec.patch_size)


def png(im: Image.Image, **params) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG", **params)
    return buf.getvalue()


def _alpha(width: int, height: int) -> np.ndarray:
    """Alpha with fully transparent, half, opaque and graded regions (left to right), so edges
    between them go through the resize."""
    a = np.empty((height, width), np.uint8)
    q = width // 4
    a[:, :q], a[:, q:2 * q], a[:, 2 * q:3 * q] = 0, 128, 255
    a[:, 3 * q:] = np.linspace(0, 255, height, dtype=np.uint8)[:, None]
    a[: height // 5] = 64                                          # a translucent band across the top
    return a


def _colours(width: int, height: int, fmt: str = "PNG") -> Image.Image:
    """Opaque RGB content (under the alpha: dark, so dropping alpha would show, not white)."""
    return Image.open(io.BytesIO(encode(width, height, fmt, "RGB", seed=width + height)))


def rgba_png(width: int, height: int) -> bytes:
    rgb = np.asarray(_colours(width, height)) // 2                # darker: far from white
    return png(Image.fromarray(np.dstack([rgb, _alpha(width, height)]), "RGBA"))


def la_png(width: int, height: int) -> bytes:
    grey = np.asarray(_colours(width, height).convert("L")) // 2
    return png(Image.fromarray(np.dstack([grey, _alpha(width, height)]), "LA"))


def palette_png(width: int, height: int, per_entry: bool) -> bytes:
    """P mode with a tRNS chunk: one transparent index, or an alpha per palette entry."""
    im = _colours(width, height).quantize(32)
    im.paste(0, (0, 0, width // 3, height))                       # a region of index 0
    if per_entry:
        return png(im, transparency=bytes([0] + [(255, 128, 64)[i % 3] for i in range(1, 32)]))
    return png(im, transparency=0)


def keyed_png(width: int, height: int, mode: str) -> bytes:
    """RGB or L with a tRNS colour key: one colour is transparent."""
    im = _colours(width, height)
    key = (0, 0, 0) if mode == "RGB" else 0
    im = im.convert(mode)
    im.paste(key, (width // 4, height // 4, width // 2, height // 2))
    return png(im, transparency=key)


def transparent_gif(width: int, height: int) -> bytes:
    im = _colours(width, height).quantize(32)
    im.paste(5, (0, 0, width // 2, height // 2))
    buf = io.BytesIO()
    im.save(buf, "GIF", transparency=5)
    return buf.getvalue()


TRANSPARENT = {
    "RGBA PNG": rgba_png, "LA PNG": la_png,
    "P PNG, transparent index": lambda w, h: palette_png(w, h, per_entry=False),
    "P PNG, alpha per entry": lambda w, h: palette_png(w, h, per_entry=True),
    "RGB PNG, colour key": lambda w, h: keyed_png(w, h, "RGB"),
    "L PNG, colour key": lambda w, h: keyed_png(w, h, "L"),
    "GIF, transparent index": transparent_gif,
}
OPAQUE = {
    "RGB JPEG": lambda w, h: encode(w, h, "JPEG", "RGB"), "L JPEG": lambda w, h: encode(w, h, "JPEG", "L"),
    "RGB PNG": lambda w, h: encode(w, h, "PNG", "RGB"), "P PNG": lambda w, h: encode(w, h, "PNG", "P"),
    "opaque RGBA PNG": lambda w, h: encode(w, h, "PNG", "RGBA"),
}
if features.check("webp"):
    TRANSPARENT["RGBA WEBP"] = lambda w, h: _webp(Image.open(io.BytesIO(rgba_png(w, h))))


def _webp(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "WEBP", lossless=True)
    return buf.getvalue()


TRANSPARENCY_SIZES = [(64, 48), (33, 90), (150, 101)]       # small; not multiples of the factor


@pytest.mark.filterwarnings("ignore:Palette images with Transparency")   # from convert("RGB")
def test_transparent_test_images_are_what_they_say():
    """The fixtures really have transparency, and dropping it would give other pixels."""
    for name, make in TRANSPARENT.items():
        data = make(64, 48)
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            assert "A" in im.getbands() or im.info.get("transparency") is not None, name
            alpha = np.asarray(im.convert("RGBA"))[..., 3]
            assert alpha.min() == 0 and alpha.max() == 255, name
            if name == "P PNG, alpha per entry":
                assert {64, 128} <= set(np.unique(alpha)), name
            assert not np.array_equal(np.asarray(im.convert("RGB")), np.asarray(qwen2_vl_convert_to_rgb(im))), name
    with Image.open(io.BytesIO(rgba_png(64, 48))) as im:
        assert set(np.unique(np.asarray(im)[..., 3])) >= {0, 64, 128, 255}
    for mode, make in (("LA", la_png), ("RGBA", rgba_png)):
        assert Image.open(io.BytesIO(make(64, 48))).mode == mode
    assert Image.open(io.BytesIO(palette_png(64, 48, True))).mode == "P"


@pytest.mark.parametrize("name", list(TRANSPARENT) + list(OPAQUE))
def test_decode_matches_qwen2_vl_preprocessing(name):
    """Decoded patches equal Qwen2-VL's preprocessing (convert_to_rgb onto white, smart_resize,
    bicubic, patchify) exactly, transparent and opaque images alike."""
    make = {**TRANSPARENT, **OPAQUE}[name]
    for w, h in TRANSPARENCY_SIZES:
        data = make(w, h)
        for spec in SPECS:
            patches, grid = decode_patches(data, spec)
            expected, expected_grid = qwen2_vl_preprocess(data, spec)
            assert grid == expected_grid, (name, w, h, spec)
            assert np.array_equal(patches, expected), (name, w, h, spec)


@pytest.mark.parametrize("name", list(OPAQUE))
def test_opaque_images_decode_as_before(name):
    """No alpha, no change: bit for bit the old ``convert("RGB")`` path, whatever the background."""
    data = OPAQUE[name](101, 77)
    for spec in (VisionSpec(), VisionSpec(background=(0, 0, 0))):
        patches, grid = decode_patches(data, spec)
        assert np.array_equal(unpatchify(patches, grid, spec), direct_decode(data, grid, spec)), name


@pytest.mark.parametrize("background", [(0, 0, 0), (30, 200, 90), (255, 0, 255)])
@pytest.mark.parametrize("name", ["RGBA PNG", "LA PNG", "P PNG, alpha per entry", "RGB PNG, colour key"])
def test_custom_background_matches_reference(name, background):
    spec = VisionSpec(background=background)
    data = TRANSPARENT[name](64, 48)
    patches, grid = decode_patches(data, spec)
    expected, expected_grid = qwen2_vl_preprocess(data, spec, background)
    assert grid == expected_grid and np.array_equal(patches, expected)
    assert not np.array_equal(patches, decode_patches(data)[0])     # the background did matter


def test_composite_values():
    """The compositing arithmetic, checked against values worked out by hand (not through Pillow's
    alpha_composite): flat regions big enough that the resize leaves their middles alone."""
    colour, size = (200, 40, 10), (112, 112)                       # 112 = 4 * 28: no resize at all
    rgba = np.zeros((*size, 4), np.uint8)
    rgba[..., :3] = colour
    rgba[:, 28:56, 3], rgba[:, 56:84, 3], rgba[:, 84:, 3] = 128, 255, 0   # columns 0..27 stay alpha 0
    data = png(Image.fromarray(rgba, "RGBA"))
    for background in (WHITE, (0, 0, 0), (10, 100, 250)):
        spec = VisionSpec(background=background)
        patches, grid = decode_patches(data, spec)
        assert grid == (1, 8, 8)
        image = unpatchify(patches, grid, spec).astype(int)
        half = [(c * 128 + b * 127) / 255 for c, b in zip(colour, background)]
        assert (image[:, :28] == background).all() and (image[:, 84:] == background).all()
        assert (image[:, 56:84] == colour).all()
        assert (np.abs(image[:, 28:56] - half) <= 1).all(), (background, image[0, 30], half)


def test_background_validation():
    assert VisionSpec().background == WHITE
    assert VisionSpec(background=[1, 2, np.int64(3)]).background == (1, 2, 3)    # stored as a tuple
    assert hash(VisionSpec(background=[1, 2, 3])) == hash(VisionSpec(background=(1, 2, 3)))
    for bad in [(1, 2), (1, 2, 3, 4), (0, 0, 256), (-1, 0, 0), (0.0, 0, 0), (True, 0, 0), "white", None]:
        with pytest.raises(ValueError, match="VisionSpec.background"):
            VisionSpec(background=bad)


def test_config_background():
    assert VisionConfig().background == WHITE and VisionConfig().spec.background == WHITE
    assert _parse_vision(None).spec == VisionSpec()
    cfg = _parse_vision({"background": [0, 128, 255], "patch_size": 16})
    assert cfg.background == (0, 128, 255) and cfg.spec == VisionSpec(patch_size=16, background=(0, 128, 255))
    for bad in [[0, 0], [0, 0, 256], [0, 0, -1], [0, 0, 1.5], [True, 0, 0], "white", 255, None]:
        with pytest.raises(ConfigError, match=r"^vision\.background: "):
            _parse_vision({"background": bad})


def test_demo_corpus_decodes_like_qwen2_vl():
    """The demo generator's pictures, its transparent PNG "logos" included, decode as Qwen2-VL's
    preprocessing does. The imagecaps rows are drawn directly: make_image_demo_data would also
    build the interleaved source's text material, which takes seconds."""
    table = _gen_imagecaps([np.random.default_rng([0, row]) for row in range(150)])
    images = [b for row in table.column("images").to_pylist() for b in row if b]
    spec = VisionSpec(max_pixels=200704)
    transparent = 0
    for data in images:
        with Image.open(io.BytesIO(data)) as im:
            if im.mode == "RGBA" and np.asarray(im)[..., 3].min() < 255:
                transparent += 1
        patches, grid = decode_patches(data, spec)
        expected, expected_grid = qwen2_vl_preprocess(data, spec)
        assert grid == expected_grid and np.array_equal(patches, expected)
    assert transparent >= 3, transparent


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "BMP"])
@pytest.mark.parametrize("keep", [0.3, 0.6, 0.98])
def test_check_image_raises_what_decoding_raises(fmt, keep):
    """The cheap check of an image a constructor does not ship fails exactly when decoding does."""
    data = encode(400, 300, fmt)
    check_image(data)
    with pytest.raises(ImageError) as decoding:
        decode_patches(data[:int(len(data) * keep)])
    with pytest.raises(ImageError) as checking:
        check_image(data[:int(len(data) * keep)])
    assert str(checking.value) == str(decoding.value)
    with pytest.raises(ImageError, match="truncated JPEG"):
        check_image(encode(64, 64, "JPEG")[:-2])
    for bad in (b"hello", bytes(1000)):
        with pytest.raises(ImageError, match="not an image"):
            check_image(bad)


def _image_graph_sample(tmp_path, policy="skip"):
    """A config, and a sample of three images (one PNG) with its placeholder tokens."""
    from flight_overlord.config import parse_config

    (tmp_path / "f.parquet").write_bytes(b"")
    cfg = parse_config({"run_dir": str(tmp_path / "run"), "data_root": str(tmp_path),
                        "sources": [{"name": "s", "paths": "f.parquet", "image_column": "images"}],
                        "global_batch": {"context_length": 4096, "samples_per_step": 1},
                        "vision": {"on_bad_image": policy}}, base_dir=tmp_path)
    spec, v = cfg.vision.spec, cfg.vision
    images = [encode(120, 90, "JPEG", seed=1), encode(64, 200, "PNG", "RGBA", seed=2), encode(300, 160, seed=3)]
    grids = [x for data in images for x in patch_grid(*image_size(data), spec)]
    tokens = [1, 2]
    for data in images:
        tokens += [v.vision_start_id] + [v.image_token_id] * placeholder_tokens(
            patch_grid(*image_size(data), spec), spec) + [v.vision_end_id, 3]
    return cfg, images, grids, np.array(tokens, dtype=np.int32)


def test_constructors_decode_only_the_images_they_ship(tmp_path, monkeypatch):
    """Image graph: a constructor decodes the images its encoder rows name, no other (a sequence's
    own constructor, shipping no pixels, decodes none), and the rows it ships are byte-identical to
    decoding every image; cutting the sample keeps the right rows."""
    from flight_overlord.constructor import assembly
    from flight_overlord.core import vision

    cfg, images, grids, tokens = _image_graph_sample(tmp_path)
    full = assembly.decode_stage("s:k:0:0", tokens, images, grids, cfg)  # no image graph: every image
    expected = [assembly.image_patches(full, i)[0] for i in range(3)]
    decodes = []
    real_decode = vision.decode_patches
    monkeypatch.setattr(vision, "decode_patches", lambda data, spec: decodes.append(images.index(data)) or
                        real_decode(data, spec))
    # item 0: images 0 and 2 encoded on this constructor's buckets 1 and 3; item 5: none (owner only)
    ships = assembly.shipped_images({1: [[0, 2, 0, 0]], 3: [[0, 0, 0, 0]], 2: []})
    assert ships == {0: {0, 2}} and assembly.shipped_images(None) is None
    sample = assembly.decode_stage("s:k:0:0", tokens, images, grids, cfg, ships[0])
    assert sorted(decodes) == [0, 2] and sample.decoded == (0, 2)
    for i in (0, 2):
        assert np.array_equal(assembly.image_patches(sample, i)[0], expected[i])
    with pytest.raises(ValueError, match="image 1 was not decoded here"):
        assembly.image_patches(sample, 1)
    table = assembly.encoder_table(0, [(sample, 2, 0, 0), (sample, 0, 0, 0)])
    reference = assembly.encoder_table(0, [(full, 2, 0, 0), (full, 0, 0, 0)])
    assert table.equals(reference)
    decodes.clear()
    owner = assembly.decode_stage("s:k:0:0", tokens, images, grids, cfg, ships.get(5, set()))
    assert decodes == [] and owner.decoded == () and len(owner.patches) == 0
    assert np.array_equal(owner.grids, full.grids)
    # cut after the second image: image 2 is dropped with its rows, image 0's stay
    cut_at = int(np.flatnonzero(tokens == cfg.vision.vision_end_id)[1]) + 1
    cut = assembly.truncate(sample, cut_at, cfg)
    assert cut.decoded == (0,) and np.array_equal(cut.patches, expected[0]) and len(cut.grids) == 6
    assert np.array_equal(assembly.image_patches(cut, 0)[0], expected[0])


@pytest.mark.parametrize("policy", ["skip", "fail"])
def test_an_unshipped_bad_image_still_drops_its_sample_under_skip(tmp_path, monkeypatch, policy):
    """Every constructor holding a sample must drop it for a bad image (vision.on_bad_image: skip),
    not only the one decoding that image: unshipped images are checked. Under fail the run stops
    at the constructor decoding it, so the others do not check."""
    from flight_overlord.constructor import assembly

    cfg, images, grids, tokens = _image_graph_sample(tmp_path, policy)
    images[1] = images[1][:len(images[1]) // 2]
    result = assembly.decode_or_error("s:k:0:0", tokens, images, grids, cfg, {0})
    if policy == "skip":
        assert isinstance(result, assembly.Failed) and "truncated PNG" in result.message
    else:
        assert isinstance(result, assembly.Sample) and result.decoded == (0,)
    assert isinstance(assembly.decode_or_error("s:k:0:0", tokens, images, grids, cfg, {1}), assembly.Failed)
