"""Image logic for image-text sources: sizes, Qwen2-VL patch grids and patchified pixels. No I/O.

Two paths that must agree. The planner needs every image's patch count to budget tokens, and
reads it from the header alone (``image_size`` -> ``patch_grid``), which is cheap. A loader or
constructor decodes the pixels (``decode_patches``). Both go through the same ``smart_resize``
of the same stored size, so the grid that was budgeted is the grid that is delivered.

Sizes are the raw stored sizes: EXIF orientation is NOT applied, neither when reading the header
nor when decoding. If only one path honoured it, rotated JPEGs would get their width and height
swapped on that path, and the two grids would disagree. Qwen2-VL's image processor does not
transpose either: it resizes the image it is handed, as it is.

Transparency is composited onto a background colour (``VisionSpec.background``, white by default)
before the resize, as Qwen2-VL's processor does (transformers' ``image_transforms.convert_to_rgb``).
Dropping the alpha channel instead would turn the transparent areas of logos and icons black, or
whatever colour the encoder left under them. Opaque images are converted to RGB as they are.
"""
from __future__ import annotations

import functools
import io
import math
import struct
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFile

from ..errors import OverlordError

MAX_ASPECT_RATIO = 200          # Qwen2-VL's processor refuses images longer than this to one side


@functools.cache
def open_formats() -> tuple[str, ...]:
    """What Image.open tries. The data is untrusted, and some of Pillow's other plugins should not see
    it (EPS, for one, runs Ghostscript); formats this Pillow build lacks are dropped. Registering the
    plugins (``Image.init``) costs a process ~3 MiB: done at the first image, not in every role that
    imports this module for a text-only run."""
    Image.init()
    return tuple(f for f in ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "AVIF") if f in Image.OPEN)


# What Pillow raises for bad data, besides its own UnidentifiedImageError (an OSError).
_PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error,
               Image.DecompressionBombError)


class ImageError(OverlordError, ValueError):
    """Bytes that are not a usable image; the message says what is wrong."""


@dataclass(frozen=True)
class VisionSpec:
    """The vision encoder's geometry (defaults: Qwen2-VL)."""
    patch_size: int = 14                # side of one ViT patch, in pixels
    merge_size: int = 2                 # merge_size x merge_size patches become one LLM token
    min_pixels: int = 56 * 56           # bounds on the resized image's area
    max_pixels: int = 28 * 28 * 1280
    background: tuple[int, int, int] = (255, 255, 255)  # RGB that transparent pixels are composited onto

    def __post_init__(self) -> None:
        # A list or numpy ints would make the spec unhashable or compare unequal: store a tuple of ints.
        bg = self.background
        if isinstance(bg, (tuple, list)) and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                                 for v in bg):
            object.__setattr__(self, "background", tuple(int(v) for v in bg))
        self.validate()

    def validate(self) -> None:
        for name in ("patch_size", "merge_size", "min_pixels", "max_pixels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"VisionSpec.{name} must be an integer, got {value!r}")
        if self.patch_size < 1:
            raise ValueError(f"VisionSpec.patch_size must be >= 1, got {self.patch_size}")
        if self.merge_size < 1:
            raise ValueError(f"VisionSpec.merge_size must be >= 1, got {self.merge_size}")
        if self.min_pixels <= 0:
            raise ValueError(f"VisionSpec.min_pixels must be > 0, got {self.min_pixels}")
        if self.max_pixels < self.min_pixels:
            raise ValueError(f"VisionSpec.max_pixels must be >= min_pixels ({self.min_pixels}), "
                             f"got {self.max_pixels}")
        bg = self.background
        if not (isinstance(bg, tuple) and len(bg) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in bg)):
            raise ValueError(f"VisionSpec.background must be three integers 0..255 (R, G, B), got {bg!r}")

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this, so the patch grid divides into merge windows."""
        return self.patch_size * self.merge_size


def _open(data: bytes) -> ImageFile.ImageFile:
    """Pillow's lazy open: it parses the header, and no pixels are decoded until ``load()``."""
    try:
        return Image.open(io.BytesIO(data), formats=open_formats())
    except Image.UnidentifiedImageError:
        raise ImageError(f"not an image (unrecognised header, {len(data)} bytes)") from None
    except Image.DecompressionBombError as e:
        raise ImageError(f"image too large: {e}") from None
    except _PIL_ERRORS as e:
        raise ImageError(f"unreadable image header: {e}") from None


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) as stored, from the header only: no pixel data is decoded."""
    with _open(data) as im:
        return im.size


def smart_resize(height: int, width: int, spec: VisionSpec = VisionSpec()) -> tuple[int, int]:
    """The (height, width) Qwen2-VL resizes an image to: multiples of ``spec.factor``, area within
    [min_pixels, max_pixels], aspect ratio kept as well as possible.

    This is transformers' ``image_processing_qwen2_vl.smart_resize`` line for line. The rounding
    decides the token count, so any deviation would make our budget disagree with the model's
    processor. Each side comes out at least ``factor``: a side that rounds to 0 makes the area 0,
    which takes the ``min_pixels`` branch, and the ``max_pixels`` branch clamps to ``factor``.
    """
    if height <= 0 or width <= 0:
        raise ImageError(f"image has no pixels: {width}x{height}")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ImageError(f"aspect ratio {max(height, width) / min(height, width):.0f}:1 of a "
                         f"{width}x{height} image exceeds {MAX_ASPECT_RATIO}:1")
    factor = spec.factor
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > spec.max_pixels:
        beta = math.sqrt((height * width) / spec.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < spec.min_pixels:
        beta = math.sqrt(spec.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patch_grid(width: int, height: int, spec: VisionSpec = VisionSpec()) -> tuple[int, int, int]:
    """(t, grid_h, grid_w) in patches for an image stored at width x height; t is 1 for an image."""
    h, w = smart_resize(height, width, spec)
    return 1, h // spec.patch_size, w // spec.patch_size


def num_patches(grid: tuple[int, int, int]) -> int:
    t, gh, gw = grid
    return t * gh * gw


def placeholder_tokens(grid: tuple[int, int, int], spec: VisionSpec = VisionSpec()) -> int:
    """LLM tokens the image occupies: the encoder merges each merge_size x merge_size window into one."""
    return num_patches(grid) // spec.merge_size ** 2


def image_patch_counts(images: list[bytes], spec: VisionSpec = VisionSpec()) -> np.ndarray:
    """Patches per image (int64), from the headers only."""
    return np.array([num_patches(patch_grid(*image_size(data), spec)) for data in images],
                    dtype=np.int64)


# The [h, w, C] image seen as (gh/m, m, p, gw/m, m, p, C) (merge windows, patches within a window,
# pixels within a patch) -> (gh/m, gw/m, m, m, C, p, p), and back.
_TO_PATCHES = (0, 3, 1, 4, 6, 2, 5)
_FROM_PATCHES = tuple(int(i) for i in np.argsort(_TO_PATCHES))


def _has_alpha(im: Image.Image) -> bool:
    """Whether the image has transparency: an alpha band (RGBA, LA, PA) or a transparency key
    (``info["transparency"]``: a PNG tRNS chunk on a P, L or RGB image, a GIF's transparent index).
    The same test as transformers' ``convert_to_rgb``."""
    return "A" in im.getbands() or im.info.get("transparency") is not None


def _to_rgb(im: Image.Image, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """An RGB image, with any transparency composited onto ``background``.

    Transformers' ``convert_to_rgb`` step for step: an image with transparency goes to RGBA first
    (which applies a palette's or a colour key's transparency, and makes LA and PA consistent with
    RGBA), is alpha-composited over an opaque canvas of the background colour, and then converted
    to RGB. An opaque image is only converted (an RGB image is returned as it is), so its pixels
    are what ``convert("RGB")`` gives.
    """
    if _has_alpha(im):
        rgba = im.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*background, 255))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    return im if im.mode == "RGB" else im.convert("RGB")


def decode_patches(data: bytes, spec: VisionSpec = VisionSpec()) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Decode, convert to RGB over ``spec.background``, resize to ``smart_resize`` (bicubic) and patchify.

    Returns ``(patches, grid)``. ``patches`` is uint8 ``[num_patches, 3 * p * p]`` and ``grid`` is
    ``(1, gh, gw)``, the same as ``patch_grid(*image_size(data), spec)``. The rows are in Qwen2-VL's
    order. The merge windows come in raster order, and within a window its m x m patches come in
    raster order, so the m*m patches that merge into one token are contiguous. Each row is
    channel-major: (C, p, p).

    Qwen2-VL's processor also repeats every frame ``temporal_patch_size`` (2) times, making a row
    (C, T, p, p). To get that from a row here, reshape it to (C, 1, p, p) and expand T on the GPU.

    The pixels are left as uint8, not rescaled or normalised: that is cheap on the GPU, and uint8
    puts 4x fewer bytes on the wire than float32. An image with transparency (an alpha channel, or
    a palette or colour key with a transparent entry) is alpha-composited onto ``spec.background``
    (white by default) before the resize, as in Qwen2-VL's processor; opaque images are only
    converted to RGB (see ``_to_rgb``). EXIF orientation is not applied (see the module docstring).
    Any decoding problem, a truncated file included, raises ImageError.
    """
    _refuse_filler_pixels()
    with _open(data) as im:
        fmt, (width, height) = im.format, im.size
        grid = patch_grid(width, height, spec)
        try:
            im.load()
            rgb = _to_rgb(im, spec.background)
        except _PIL_ERRORS as e:
            raise _load_error(fmt, e) from None
        if rgb.size != (width, height):        # the budget was made from the header's size
            raise ImageError(f"{fmt} header says {width}x{height} but the image decodes to {rgb.size}")
        _, gh, gw = grid
        resized = rgb.resize((gw * spec.patch_size, gh * spec.patch_size), Image.Resampling.BICUBIC)
    m, p = spec.merge_size, spec.patch_size
    pixels = np.asarray(resized, dtype=np.uint8)
    patches = pixels.reshape(gh // m, m, p, gw // m, m, p, 3).transpose(_TO_PATCHES)
    return np.ascontiguousarray(patches).reshape(num_patches(grid), 3 * p * p), grid


def _refuse_filler_pixels() -> None:
    # Pillow raises "image file is truncated" unless someone set ImageFile.LOAD_TRUNCATED_IMAGES, in
    # which case it fills the missing part with grey: refuse rather than train on filler pixels.
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise ImageError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set: truncated images would decode "
                         "to filler pixels")


def _load_error(fmt: str, e: Exception) -> ImageError:
    what = "truncated" if "truncated" in str(e).lower() else "corrupt"
    return ImageError(f"{what} {fmt}: {e}")


def check_image(data: bytes, spec: VisionSpec = VisionSpec()) -> None:
    """Raise the ImageError ``decode_patches`` raises for bad data (unreadable header, extreme aspect
    ratio, truncated or corrupt pixel data, a decoded size other than the header's), at a fraction
    of its cost: the compressed data is decoded (a JPEG at its smallest draft scale, which still
    reads every coded block) but not converted, resized or patchified. For a constructor that
    ships none of an image's pixels yet must drop its sample exactly when the constructor that
    does would (``vision.on_bad_image: skip`` with an image graph)."""
    _refuse_filler_pixels()
    with _open(data) as im:
        fmt, size = im.format, im.size
        patch_grid(*size, spec)
        try:
            scaled = fmt == "JPEG" and im.draft(im.mode, (1, 1)) is not None
            im.load()
        except _PIL_ERRORS as e:
            raise _load_error(fmt, e) from None
        if not scaled and im.size != size:
            raise ImageError(f"{fmt} header says {size[0]}x{size[1]} but the image decodes to {im.size}")


def unpatchify(patches: np.ndarray, grid: tuple[int, int, int], spec: VisionSpec = VisionSpec()) -> np.ndarray:
    """The inverse of ``decode_patches``' layout: the resized image as uint8 [h, w, 3]."""
    t, gh, gw = grid
    if t != 1 or patches.shape != (gh * gw, 3 * spec.patch_size ** 2):
        raise ValueError(f"patches of shape {patches.shape} do not match grid {grid}")
    m, p = spec.merge_size, spec.patch_size
    windows = patches.reshape(gh // m, gw // m, m, m, 3, p, p).transpose(_FROM_PATCHES)
    return np.ascontiguousarray(windows).reshape(gh * p, gw * p, 3)


def decode_sample_images(images: list[bytes], grids: list[int], spec: VisionSpec,
                         only: list[int] | None = None, check_others: bool = False) -> np.ndarray:
    """The constructor's decode stage: a sample's images -> uint8 patches [sum of patches, 3*p*p].
    The grids were budgeted from the headers; a decode that disagrees is an error, not a silent
    change of the sample's length. ``only``: the indices of the images to decode, in increasing
    order (the result holds their patches alone); the others are not decoded, only checked with
    ``check_image`` when ``check_others``."""
    out = []
    wanted = range(len(images)) if only is None else set(only)
    for i, data in enumerate(images):
        if i not in wanted:
            if check_others:
                check_image(data, spec)  # the error decode_patches would raise, for the same bad data
            continue
        patches, grid = decode_patches(data, spec)
        if list(grid) != list(grids[3 * i:3 * i + 3]):
            raise ImageError(f"image {i}: decodes to grid {grid}, its header gave {grids[3 * i:3 * i + 3]}")
        out.append(patches)
    return np.concatenate(out) if out else np.zeros((0, 3 * spec.patch_size ** 2), np.uint8)


def patches_from_bytes(images: list[bytes], spec: VisionSpec) -> np.ndarray:
    """Patches decoded at the loader travel as raw bytes: view them back as [n, 3*p*p] uint8."""
    dim = 3 * spec.patch_size ** 2
    if not images:
        return np.zeros((0, dim), np.uint8)
    return np.frombuffer(b"".join(images), dtype=np.uint8).reshape(-1, dim)
