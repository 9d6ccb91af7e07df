"""How the demo generators write a source: rows split over files of several row groups, with the
clamps that keep even a tiny scale a real multi-file, multi-row-group source."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FILES_AT_SCALE_1 = 4
ROW_GROUPS_PER_FILE = 6
MIN_FILES = 2
MIN_ROW_GROUPS = 2
MIN_ROWS_PER_GROUP = 4


def layout(rows_at_scale_1: int, scale: float) -> tuple[int, int]:
    """(rows, files) for a source: linear in ``scale``, clamped to >= 2 files x 2 row groups x 4 rows."""
    n_files = max(MIN_FILES, round(FILES_AT_SCALE_1 * scale))
    rows = max(round(rows_at_scale_1 * scale), n_files * MIN_ROW_GROUPS * MIN_ROWS_PER_GROUP)
    return rows, n_files


def write_source(directory: Path, table: pa.Table, n_files: int) -> list[Path]:
    """Split ``table``'s rows over ``n_files`` files of several row groups, adding ``doc_id``."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("part-*.parquet"):        # from an earlier run at another scale
        stale.unlink()
    paths, first_id = [], 0
    for i, rows in enumerate(np.array_split(np.arange(table.num_rows), n_files)):
        n_groups = max(MIN_ROW_GROUPS, min(ROW_GROUPS_PER_FILE, len(rows) // MIN_ROWS_PER_GROUP))
        part = table.slice(first_id, len(rows))
        part = part.append_column("doc_id", pa.array(np.arange(first_id, first_id + len(rows)), pa.int64()))
        path = directory / f"part-{i:05d}.parquet"
        pq.write_table(part, path, row_group_size=math.ceil(len(rows) / n_groups), compression="zstd",
                       write_page_checksum=True)  # readers verify them: a flipped bit is caught, not trained on
        paths.append(path)
        first_id += len(rows)
    return paths


def check_arguments(seed: int, scale: float) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
