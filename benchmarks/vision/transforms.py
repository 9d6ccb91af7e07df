"""``vision.image_text`` part 1: the transforms' cost per sample (text tokenizing; image decode, resize and
patching by size class) and per row group, measured in this process."""
from __future__ import annotations

import glob
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SMALL_PIXELS = 160 * 160  # small: width * height at most this
LARGE_SIDE = 512          # large: the long side at least this; medium: neither
TEXT_SOURCES = ("captions", "longdocs")
IMAGE_SOURCES = ("imagecaps", "interleaved")
PLACEMENTS = ("constructor", "loader")


# ---------------------------------------------------------------------------------------------
# Part 1: transform cost per sample, in this process
# ---------------------------------------------------------------------------------------------

def source_files(data_dir: Path, source: str) -> list[str]:
    return sorted(glob.glob(str(data_dir / source / "*.parquet")))


def column_values(data_dir: Path, source: str, column: str) -> list:
    """Every row of ``column`` over the source's files (lists are flattened, nulls dropped)."""
    values = []
    for path in source_files(data_dir, source):
        array = pq.read_table(path, columns=[column]).column(0)
        if pa.types.is_list(array.type):
            array = pc.list_flatten(array)
        values += [v for v in array.to_pylist() if v is not None]
    return values


def image_classes(data_dir: Path) -> dict[str, list[bytes]]:
    """Every image of the image-text sources, by size class."""
    from flight_overlord.core.vision import image_size
    classes: dict[str, list[bytes]] = {"small image": [], "medium image": [], "large image": []}
    for source in IMAGE_SOURCES:
        for data in column_values(data_dir, source, "images"):
            width, height = image_size(data)
            kind = ("small" if width * height <= SMALL_PIXELS else
                    "large" if max(width, height) >= LARGE_SIDE else "medium")
            classes[f"{kind} image"].append(data)
    return classes


def pick(rng: np.random.Generator, items: list, limit: int) -> list:
    if len(items) <= limit:
        return list(items)
    return [items[i] for i in sorted(rng.choice(len(items), limit, replace=False))]


def timed_us(fn, items: list, rounds: int) -> np.ndarray:
    """Microseconds of ``fn(item)``, every item timed once per round: shape [rounds, items]."""
    out = np.empty((rounds, len(items)))
    for r in range(rounds):
        for i, item in enumerate(items):
            start = time.perf_counter_ns()
            fn(item)
            out[r, i] = (time.perf_counter_ns() - start) / 1e3
    return out


@dataclass
class KindRow:
    """One kind of sample: what it looks like, and its transforms' cost per sample."""
    kind: str
    count: int
    size: str              # the median image's width x height ("-" for text)
    encoded: float         # median stored bytes
    patches: float | None  # median vision-encoder patches
    expansion: float       # bytes after the transform / bytes stored, summed over the samples
    costs: list[tuple[str, float, float | None]] = field(default_factory=list)  # (transform, median, mean) µs


def text_row(name: str, texts: list[str], tokenize, context_length: int, rounds: int) -> KindRow:
    sizes = [len(t.encode()) for t in texts]
    column = pa.array(texts, pa.string())
    tokens = tokenize(column, context_length)
    row = KindRow(f"text: {name}", len(texts), "-", float(np.median(sizes)), None,
                  tokens.values.nbytes / max(1, sum(sizes)))
    single = timed_us(lambda t: tokenize(pa.array([t], pa.string()), context_length), texts, rounds)
    row.costs.append(("byte_tokenizer, one sample per call", float(np.median(single)), float(single.mean())))
    whole = timed_us(lambda c: tokenize(c, context_length), [column], rounds) / len(texts)
    row.costs.append(("byte_tokenizer, all in one call (amortised)", float(np.median(whole)), None))
    return row


def image_row(kind: str, images: list[bytes], spec, rounds: int) -> KindRow:
    from flight_overlord.core.vision import decode_patches, image_size, num_patches, patch_grid
    sizes = [image_size(data) for data in images]
    grids = [patch_grid(w, h, spec) for w, h in sizes]
    patches = [num_patches(g) for g in grids]
    area = [w * h for w, h in sizes]
    w, h = sizes[int(np.argsort(area)[len(area) // 2])]
    encoded = [len(data) for data in images]
    decoded = sum(patches) * 3 * spec.patch_size ** 2
    row = KindRow(kind, len(images), f"{w}x{h} px", float(np.median(encoded)), float(np.median(patches)),
                  decoded / sum(encoded))
    header = timed_us(lambda data: patch_grid(*image_size(data), spec), images, rounds)
    row.costs.append(("header only: image_size + patch_grid", float(np.median(header)), float(header.mean())))
    decode = timed_us(lambda data: decode_patches(data, spec), images, rounds)
    row.costs.append(("full decode: decode_patches", float(np.median(decode)), float(decode.mean())))
    return row


@dataclass
class RowGroupRow:
    """The loader's sample transform on real row groups of one source, per sample."""
    source: str
    samples: int
    us: dict[str, float]      # decode_at -> µs per sample (median over rounds)
    bytes: dict[str, float]   # decode_at -> bytes per sample handed to the wire (tokens + images)


def row_group_rows(data_dir: Path, tokenize, vision, context_length: int, row_groups: int,
                   rounds: int) -> list[RowGroupRow]:
    from flight_overlord.transforms.image_text import transform_rows
    rows = []
    for source in (*TEXT_SOURCES, *IMAGE_SOURCES):
        path = source_files(data_dir, source)[0]
        parquet = pq.ParquetFile(path)
        groups = range(min(row_groups, parquet.num_row_groups))
        image_text = source in IMAGE_SOURCES
        columns = ["texts", "images"] if image_text else ["text"]
        tables = [parquet.read_row_group(g, columns=columns) for g in groups]
        samples = sum(t.num_rows for t in tables)
        us, nbytes = {}, {}
        for decode_at in PLACEMENTS:
            if image_text:
                def transform(table, decode=decode_at == "loader"):
                    texts, images = (table.column(c).combine_chunks() for c in columns)
                    return transform_rows(texts, images, tokenize, vision, context_length, decode=decode)
                out = [transform(t) for t in tables]
                nbytes[decode_at] = sum(4 * len(tok) + sum(len(b) for b in img)
                                        for o in out for tok, img in zip(o.tokens, o.images)) / samples
            else:
                def transform(table):
                    return tokenize(table.column(0).combine_chunks(), context_length)
                nbytes[decode_at] = sum(transform(t).values.nbytes for t in tables) / samples
            us[decode_at] = float(np.median(timed_us(transform, tables, rounds).sum(axis=1))) / samples
        rows.append(RowGroupRow(source, samples, us, nbytes))
    return rows


def run_transforms(args, data_dir: Path) -> tuple[list[KindRow], list[RowGroupRow]]:
    from flight_overlord.config import VisionConfig
    from flight_overlord.transforms import make_transform
    rng = np.random.default_rng(0)
    tokenize = make_transform("byte_tokenizer")
    vision = VisionConfig(patch_size=14, merge_size=2)
    spec = vision.spec
    kinds = [text_row(name, pick(rng, column_values(data_dir, name, "text"), args.samples), tokenize,
                      args.context_length, args.rounds) for name in TEXT_SOURCES]
    for kind, images in image_classes(data_dir).items():
        if images:
            kinds.append(image_row(kind, pick(rng, images, args.samples), spec, args.rounds))
    return kinds, row_group_rows(data_dir, tokenize, vision, args.context_length, args.row_groups, args.rounds)
