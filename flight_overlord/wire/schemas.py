"""Wire schemas, loaded from the JSON data files in ``schemas/`` (their single source of truth).

pyproject.toml maps that folder onto the package ``flight_overlord.wire.schema_files``, so the same
lookup finds it in the repository (editable install) and in an installed wheel (``package_data``).
"""
from __future__ import annotations

import functools
import json

import numpy as np
import pyarrow as pa

from ..package_data import data_folder

SCHEMA_DIR = data_folder("flight_overlord.wire.schema_files", "schemas")


def parse_type(spec: str) -> pa.DataType:
    """``"int32"``, ``"string"``, ``"list<int32>"`` ... -> the Arrow type (aliases are pyarrow's own)."""
    spec = spec.strip()
    if spec.startswith("list<") and spec.endswith(">"):
        return pa.list_(parse_type(spec[5:-1]))
    return pa.type_for_alias(spec)


@functools.cache
def load_schema(name: str) -> pa.Schema:
    path = SCHEMA_DIR / f"{name}.json"
    if not path.is_file():
        raise KeyError(f"no wire schema named {name!r} in {SCHEMA_DIR}")
    spec = json.loads(path.read_text())
    fields = [pa.field(f["name"], parse_type(f["type"]), nullable=False) for f in spec["fields"]]
    return pa.schema(fields, metadata={"name": spec["name"]})


SAMPLE_METADATA = "sample_metadata"
SAMPLES = "samples"
MICROBATCH = "microbatch"
ENCODER_BATCH = "encoder_batch"
HDP_MICROBATCH = "hdp_microbatch"
# encoded_plan.json: its "name", the schema's metadata on the wire, is "plan_view", what Planners and constructors
# of other builds expect
ENCODED_PLAN = "encoded_plan"


def list_array(rows, value_type: pa.DataType = pa.int32()) -> pa.ListArray:
    """A list column from per-row numpy arrays (one buffer copy, no per-row Python objects)."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    values = np.concatenate(rows) if len(rows) else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, value_type))
