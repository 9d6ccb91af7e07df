"""Arrow tables of the wire schemas -> dicts of torch tensors (zero-copy views of the Arrow buffers),
and their optional placement (pinned memory, a device)."""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import torch


def _rows(table: pa.Table, name: str) -> list["torch.Tensor"]:
    """A list column as one torch tensor per row: zero-copy views of the Arrow values buffer."""
    import torch
    column = table.column(name).combine_chunks()
    offsets = column.offsets.to_numpy()
    with warnings.catch_warnings():  # Arrow buffers are read-only; torch only warns about that
        warnings.simplefilter("ignore", UserWarning)
        values = torch.from_numpy(column.values.to_numpy(zero_copy_only=False))
    return [values[offsets[i]:offsets[i + 1]] for i in range(len(column))]


def held_positions(token_ranges: list[int]) -> int:
    """How many positions of the sequence flat (start, end) pairs name."""
    return sum(end - start for start, end in zip(token_ranges[::2], token_ranges[1::2]))


def received(row: "torch.Tensor", token_ranges: list[int], held: int) -> "torch.Tensor | None":
    """A token field's row (``held`` positions), or None where the rank holds no positions at all
    (no ``token_ranges``) or did not receive this field (another pipeline stage's: its row is empty)."""
    return row if token_ranges and len(row) == held else None


def table_to_microbatches(table: pa.Table) -> list[dict]:
    """Arrow microbatch rows -> dicts of torch tensors (token and pixel tensors are zero-copy views).

    ``input_ids`` (and ``position_ids``, ``labels``, ``loss_mask``) hold the positions
    ``token_ranges`` names: the whole sequence, this rank's context-parallel share, or nothing
    (metadata only: they are None; ``cu_seqlens`` and the keys are still there for pipeline
    stages and broadcast receivers). A field the rank's pipeline stage does not receive is None too
    (by default the first stage gets ``input_ids``, ``position_ids`` and pixels, the last ``labels``
    and ``loss_mask``: ``Strategy.pipeline_stages``). Under THD context parallelism ``cu_seqlens`` and
    ``cu_seqlens_padded`` may end with a padding-only sequence (zero real tokens: the buffer's tail
    padding), one more than ``sample_keys``, as TransformerEngine takes them. Image-text rows add
    ``pixel_values`` uint8 [patches, 3*p*p] and ``image_grid_thw`` int32 [images, 3]. Under
    distribute('HDP'): :func:`hdp_microbatches`."""
    import torch

    if (table.schema.metadata or {}).get(b"name") == b"hdp_microbatch":
        return hdp_microbatches(table)

    tensors = {name: _rows(table, name) for name in ("input_ids", "position_ids", "labels", "loss_mask",
                                                     "pixel_values", "image_grid_thw")}
    lists = {name: table.column(name).to_pylist()
             for name in ("step", "bucket", "token_ranges", "sequence_length", "cu_seqlens", "cu_seqlens_padded",
                          "sample_keys", "num_tokens")}
    out = []
    for i in range(table.num_rows):
        ranges = lists["token_ranges"][i]
        held = held_positions(ranges)
        grid = tensors["image_grid_thw"][i].view(-1, 3)
        pixels = tensors["pixel_values"][i]
        patches = int(grid.prod(dim=1).sum()) if len(grid) else 0
        mb = {name: lists[name][i] for name in lists}
        mb.update({name: received(tensors[name][i], ranges, held)
                   for name in ("input_ids", "position_ids", "labels", "loss_mask")})
        mb["microbatch"] = i
        mb["cu_seqlens"] = torch.tensor(lists["cu_seqlens"][i], dtype=torch.int32)
        mb["cu_seqlens_padded"] = torch.tensor(lists["cu_seqlens_padded"][i], dtype=torch.int32)
        mb["image_grid_thw"] = grid
        mb["pixel_values"] = pixels.view(patches, -1) if patches and len(pixels) else None
        out.append(mb)
    return out


def hdp_microbatches(table: pa.Table) -> list[dict]:
    """``schemas/hdp_microbatch.json`` rows -> dicts: token tensors (zero-copy; None for metadata only)
    and, per sequence, its CP group (``seq_cp_size``, ``seq_cp_rank``, ``seq_cp_first``: the domain
    ranks [first, first + size) to form or pick a process group from), its THD chunks
    (``token_ranges``), the whole sequences' ``cu_seqlens`` / ``cu_seqlens_padded`` and where each
    share sits in ``input_ids`` (``cu_local``)."""
    import torch

    names = ("input_ids", "position_ids", "labels", "loss_mask")
    tensors = {name: _rows(table, name) for name in names}
    lists = {name: table.column(name).to_pylist() for name in table.column_names if name not in names}
    out = []
    for i in range(table.num_rows):
        mb = {name: lists[name][i] for name in lists}
        held = int(lists["cu_local"][i][-1]) if lists["cu_local"][i] else 0
        mb.update({name: received(tensors[name][i], lists["token_ranges"][i], held) for name in names})
        for name in ("cu_seqlens", "cu_seqlens_padded", "cu_local"):
            mb[name] = torch.tensor(lists[name][i], dtype=torch.int32)
        out.append(mb)
    return out


def table_to_encoder_inputs(table: pa.Table) -> list[dict]:
    """Encoder rows (one per image) -> dicts: ``pixel_values`` uint8 [patches, 3*p*p] (zero-copy) and
    ``image_grid_thw`` int32 [1, 3], with the owner to send the embeddings back to."""
    pixels, grids = _rows(table, "pixel_values"), _rows(table, "image_grid_thw")
    keys, images, buckets, mbs = (table.column(c).to_pylist()
                                  for c in ("sample_key", "image_index", "owner_bucket", "owner_microbatch"))
    out = []
    for i in range(table.num_rows):
        grid = grids[i].view(-1, 3)
        out.append({"sample_key": keys[i], "image_index": images[i], "owner_bucket": buckets[i],
                    "owner_microbatch": mbs[i],
                    "image_grid_thw": grid, "pixel_values": pixels[i].view(int(grid.prod(dim=1).sum()), -1)})
    return out


class TensorPlacement:
    """Moves a microbatch dict's tensors: into pinned memory, then to ``device`` (asynchronously
    from pinned memory); other values are left as they are."""

    def __init__(self, device=None, pin_memory: bool = False):
        import torch
        if pin_memory and not torch.cuda.is_available():
            raise ValueError("pin_memory=True needs an accelerator, and torch.cuda.is_available() is False "
                             "(on the CPU, leave it off: the tensors are zero-copy views already)")
        self.device = None if device is None else torch.device(device)
        self.pin_memory = pin_memory

    def __call__(self, row: dict) -> dict:
        import torch
        out = {}
        for name, value in row.items():
            if isinstance(value, torch.Tensor):
                if self.pin_memory:
                    value = value.pin_memory()
                if self.device is not None:
                    value = value.to(self.device, non_blocking=self.pin_memory)
            out[name] = value
        return out
