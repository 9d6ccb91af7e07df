"""``overlord partition``'s profile (``loader/profile.py``) over real Parquet files: measured once and
journaled, reused while the files it depends on are unchanged, measured again when one changes; the
plan made from it is read back as written."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from flight_overlord.config import parse_config
from flight_overlord.loader.profile import load_or_profile, partition, read_plan


def _write(path, rows: int) -> None:
    pq.write_table(pa.table({"text": [f"sample {i} " * (i % 5 + 1) for i in range(rows)]}), path, row_group_size=8)


def _config(tmp_path):
    return parse_config({"run_dir": str(tmp_path / "run"),
                         "sources": [{"name": "a", "paths": "a.parquet"}, {"name": "b", "paths": "b.parquet"}],
                         "global_batch": {"context_length": 128, "microbatches": 1, "samples_per_step": 4}},
                        base_dir=tmp_path)


def test_the_profile_is_reused_until_a_file_changes(tmp_path):
    _write(tmp_path / "a.parquet", 40)
    _write(tmp_path / "b.parquet", 24)
    cfg = _config(tmp_path)
    measured, reused = load_or_profile(cfg)
    assert not reused and [p.name for p in measured] == ["a", "b"]
    assert [(p.rows, p.row_groups, p.files) for p in measured] == [(40, 5, 1), (24, 3, 1)]
    assert load_or_profile(cfg) == (measured, True)
    assert load_or_profile(cfg, reprofile=True)[1] is False
    _write(tmp_path / "b.parquet", 32)  # another size: the fingerprint no longer holds
    again, reused = load_or_profile(_config(tmp_path))
    assert not reused and again[1].rows == 32


def test_the_plan_is_journaled_and_read_back(tmp_path):
    _write(tmp_path / "a.parquet", 40)
    _write(tmp_path / "b.parquet", 24)
    cfg = _config(tmp_path)
    assert read_plan(cfg) is None
    plan, table = partition(cfg, cpus=2, memory_gib=1)
    assert read_plan(cfg).to_dict() == plan.to_dict()
    assert "profile:" in table and "(measured now)" in table
