"""``core.file_ids.FileIds``: sorted ids held in compressed blocks read like a sorted list."""
from __future__ import annotations

import pyarrow as pa
import pytest

from flight_overlord.core import file_ids
from flight_overlord.core.file_ids import FileIds


def test_file_ids_read_like_a_sorted_list_across_blocks(monkeypatch):
    monkeypatch.setattr(file_ids, "BLOCK", 7)
    monkeypatch.setattr(file_ids, "DECODED", 2)
    names = sorted(f"folder/ß-{i:04d}.parquet" for i in range(50))
    ids = FileIds(pa.array(names))
    assert len(ids) == 50 and ids.to_pylist() == names and [ids[i] for i in range(50)] == names
    assert ids[-1] == names[-1] and [ids.index(n) for n in reversed(names)] == list(reversed(range(50)))
    assert [(lo, len(batch)) for lo, batch in ids.batches()] == [(i, min(7, 50 - i)) for i in range(0, 50, 7)]
    for missing in ("a", "folder/ß-0003.parquetx", "zzz"):
        with pytest.raises(KeyError):
            ids.index(missing)
    with pytest.raises(IndexError):
        ids[50]
    assert FileIds(pa.array(names)) == ids != FileIds(pa.array(names[1:]))
