"""The table of the samples a constructor asked a loader process for (schemas/samples.json)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..wire.schemas import SAMPLES, load_schema
from .row_groups import RowGroupSamples


def samples_table(parts: list[tuple[RowGroupSamples, int]]) -> pa.Table:
    """The requested rows, in request order: one ``take`` per row group and column, one concatenation
    per column, then one reorder. Every call is an Arrow kernel (no Python per row): a loader process
    builds one table for the samples of all its actors (a step of 96 sources: ~100 rows, ~30 row groups)."""
    groups: dict[int, tuple[RowGroupSamples, list[int], list[int]]] = {}
    for place, (buffered, row) in enumerate(parts):
        _, rows, places = groups.setdefault(id(buffered), (buffered, [], []))
        rows.append(row)
        places.append(place)
    schema = load_schema(SAMPLES)
    if not groups:
        return schema.empty_table()
    tokens_type = schema.field("tokens").type
    keys, tokens, images, grids, masks, order = [], [], [], [], [], []
    text_only = all(buffered.images is None and buffered.grids is None for buffered, _, _ in groups.values())
    unmasked = all(buffered.loss_mask is None for buffered, _, _ in groups.values())
    for buffered, rows, places in groups.values():
        indices = pa.array(rows, pa.int32())
        keys.append(buffered.keys.array(indices))
        taken = buffered.tokens_of(indices)
        tokens.append(taken if taken.type == tokens_type else taken.cast(tokens_type))  # widened (compact_tokens)
        if not text_only:
            images.append(_taken(buffered.images, indices, pa.binary()))
            grids.append(_taken(buffered.grids, indices, pa.int32()))
        if not unmasked:
            masks.append(_taken(buffered.loss_mask, indices, pa.uint8()))
        order.extend(places)
    table = pa.table({
        "key": pa.concat_arrays(keys),
        "tokens": pa.concat_arrays(tokens),
        "images": _empty_lists(len(parts), pa.binary()) if text_only else pa.concat_arrays(images),
        "image_grids": _empty_lists(len(parts), pa.int32()) if text_only else pa.concat_arrays(grids),
        # sources without a loss mask: empty lists
        "loss_mask": _empty_lists(len(parts), pa.uint8()) if unmasked else pa.concat_arrays(masks),
    }, schema=schema)
    return table.take(pa.array(np.argsort(order), pa.int64())) if len(groups) > 1 else table


def _taken(values: pa.ListArray | None, indices: pa.Array, value_type: pa.DataType) -> pa.ListArray:
    """Rows ``indices`` of a row group's image or loss-mask column (None, a source without: empty lists)."""
    return values.take(indices) if values is not None else _empty_lists(len(indices), value_type)


def _empty_lists(rows: int, value_type: pa.DataType) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(np.zeros(rows + 1, np.int32)), pa.array([], value_type))
