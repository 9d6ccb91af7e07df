"""A loader actor keeps only its newest ``OPEN_FILES_KEPT`` Parquet files open (an open file's footer and
reader state would otherwise pile up over a long run, one per file it has come to), and reads the same
tokens whatever it had to reopen, from several threads at once too."""
from __future__ import annotations

import concurrent.futures

import pyarrow as pa
import pyarrow.parquet as pq

from flight_overlord.config.parse import parse_config
from flight_overlord.loader import row_groups
from flight_overlord.loader.row_groups import SourceShare


def _share(tmp_path) -> SourceShare:
    for f in range(5):
        pq.write_table(pa.table({"text": [f"file {f} row {i} " * (i % 5 + 1) for i in range(12)]}),
                       tmp_path / f"part-{f}.parquet", row_group_size=4)  # 3 row groups each
    cfg = parse_config({"sources": [{"name": "s", "paths": "part-*.parquet"}], "run_dir": str(tmp_path / "run"),
                        "global_batch": {"context_length": 256, "microbatches": 1, "samples_per_step": 4}},
                       base_dir=tmp_path)
    return SourceShare(cfg.source("s"), 0, 256)


def test_a_share_keeps_its_newest_files_open_and_reads_the_same_tokens_after_reopening(tmp_path, monkeypatch):
    share = _share(tmp_path)
    owned = list(share.row_groups)
    order = owned[::2] + owned[1::2] + owned  # files come up again and again
    try:
        monkeypatch.setattr(row_groups, "OPEN_FILES_KEPT", len(share.source.files))
        kept_open = {rg: share.read(rg).tokens for rg in share.row_groups}  # every file open: the reference
        monkeypatch.setattr(row_groups, "OPEN_FILES_KEPT", 2)
        share.close()
        for rg in order:
            assert share.read(rg).tokens.equals(kept_open[rg])
            assert len(share._open) <= 2
        with concurrent.futures.ThreadPoolExecutor(4) as pool:  # a handle falling out under another thread's read
            read = list(pool.map(lambda rg: share.read(rg).tokens, order * 3))
        assert all(tokens.equals(kept_open[rg]) for rg, tokens in zip(order * 3, read))
        assert len(share._open) <= 2
    finally:
        share.close()
    assert not share._open
