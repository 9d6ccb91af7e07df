"""Wire schemas, loaded from the JSON data files in ``schemas/`` (their single source of truth)."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pyarrow as pa

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


def parse_type(spec: str) -> pa.DataType:
    """``"int32"``, ``"string"``, ``"list<int32>"`` ... -> the Arrow type (aliases are pyarrow's own)."""
    spec = spec.strip()
    if spec.startswith("list<") and spec.endswith(">"):
        return pa.list_(parse_type(spec[5:-1]))
    return pa.type_for_alias(spec)


@functools.cache
def load_schema(name: str) -> pa.Schema:
    path = SCHEMA_DIR / f"{name}.json"
    if not path.exists():
        raise KeyError(f"no wire schema named {name!r} in {SCHEMA_DIR}")
    spec = json.loads(path.read_text())
    fields = [pa.field(f["name"], parse_type(f["type"]), nullable=False) for f in spec["fields"]]
    return pa.schema(fields, metadata={"name": spec["name"]})


SAMPLE_METADATA = "sample_metadata"
SAMPLES = "samples"
MICROBATCH = "microbatch"
ROW_GROUP_CATALOG = "row_group_catalog"
