"""``core.order``: ``RowGroups`` (a source's row groups as columns) is the same sequence, with the same
lookups and hashes, as a sorted list of ``RowGroupRef``; ``ReadOrder`` over it is ``epoch_order``."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from flight_overlord.core.order import ReadOrder, RowGroupRef, RowGroups, epoch_order, owned_row_groups, stable_hash


def refs(seed: int = 0, files: int = 300) -> list[RowGroupRef]:
    rng = np.random.default_rng(seed)
    return [RowGroupRef(f"d{rng.integers(0, 3)}/ü-{f:05d}.parquet", g, int(rng.integers(1, 60)))
            for f in rng.choice(100_000, files, replace=False) for g in range(int(rng.integers(1, 4)))]


def test_row_groups_are_the_sorted_refs_with_their_lookups():
    listed = refs()
    columns = RowGroups.of(reversed(listed))
    assert list(columns) == sorted(listed) == [columns[i] for i in range(len(columns))]
    assert columns == sorted(listed) and columns.total_rows == sum(rg.num_rows for rg in listed)
    for i, rg in enumerate(sorted(listed)):
        assert columns.index(rg.file, rg.row_group) == i
    with pytest.raises(KeyError):
        columns.index("no/such.parquet", 0)
    with pytest.raises(KeyError):
        columns.index(sorted(listed)[0].file, 99)
    assert columns.hashes(7, "web", 2).tolist() == [stable_hash(7, "web", 2, rg.file, rg.row_group)
                                                    for rg in sorted(listed)]
    for actor in range(3):
        assert list(owned_row_groups(columns, actor, 3)) == owned_row_groups(listed, actor, 3)


def test_row_groups_of_files_in_any_order_are_sorted_by_file_then_row_group():
    ids = pa.array(["b.parquet", "a.parquet", "c.parquet"])
    rows = np.array([5, 6, 7, 8, 9, 10])  # b: 5, 6; a: 7; c: 8, 9, 10
    columns = RowGroups.of_files(ids, np.array([0, 2, 3, 6]), rows)
    assert list(columns) == [RowGroupRef("a.parquet", 0, 7), RowGroupRef("b.parquet", 0, 5),
                             RowGroupRef("b.parquet", 1, 6), RowGroupRef("c.parquet", 0, 8),
                             RowGroupRef("c.parquet", 1, 9), RowGroupRef("c.parquet", 2, 10)]
    assert RowGroups.of_files(pa.array(["a.parquet", "b.parquet"]), np.array([0, 1, 3]), np.array([7, 5, 6])) \
        == [RowGroupRef("a.parquet", 0, 7), RowGroupRef("b.parquet", 0, 5), RowGroupRef("b.parquet", 1, 6)]


def test_a_read_order_over_columns_is_epoch_order_in_units_of_its_window():
    listed = refs(1)
    for window in (1, 3):
        order = ReadOrder("web", RowGroups.of(listed), seed=5, window=window)
        for epoch in range(2):
            expected = epoch_order(listed, seed=5, source="web", epoch=epoch)
            units = [order.unit(epoch, i)[0] for i in range(order.units)]
            flat = units if window == 1 else [rg for unit in units for rg in unit.row_groups]
            assert flat == expected
