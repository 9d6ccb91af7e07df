"""The constructor's transforms (constructor/assembly.py), on small real inputs: no process, no Flight.

A microbatch is its samples packed back to back with next-token labels inside each sample (-100 across
sample boundaries, on padding, on image placeholders and where a loss mask says so); a sample is cut
without splitting an image; a failed decode is dropped or stops the run as the config says; each rank's
table holds the positions its delivery names, in the published wire schema.
"""
from __future__ import annotations

import io
import json
import logging

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from flight_overlord.constructor.assembly import (
    BadSample,
    Failed,
    Sample,
    build_microbatch,
    decode_or_error,
    delivery_ranges,
    drop_bad,
    encoder_table,
    image_patches,
    rank_table,
    sample_loss_masks,
    shipped_images,
    truncate,
)
from flight_overlord.core.mesh import Delivery, Mesh
from flight_overlord.core.packing import pack
from flight_overlord.core.stages import ALL_FIELDS
from flight_overlord.core.vision import image_size, patch_grid
from flight_overlord.wire.schemas import SCHEMA_DIR

from .constructor_data import make_cfg

IGNORE = -100  # the label of a position that is not trained on (the microbatch schema's value)
START, IMAGE, END = 257, 256, 258  # the config's vision_start_id, image_token_id, vision_end_id (defaults)


def tokens(*values) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def published_fields(name: str) -> list[tuple[str, str]]:
    """(name, type) of every field of a wire schema, read from its JSON file in ``schemas/``."""
    spec = json.loads((SCHEMA_DIR / f"{name}.json").read_text())
    return [(f["name"], f["type"]) for f in spec["fields"]]


def arrow_fields(table: pa.Table) -> list[tuple[str, str]]:
    names = {pa.int32(): "int32", pa.int64(): "int64", pa.string(): "string", pa.int8(): "int8",
             pa.uint8(): "uint8"}
    return [(f.name, f"list<{names[f.type.value_type]}>" if pa.types.is_list(f.type) else names[f.type])
            for f in table.schema]


def image_sample(key: str = "v:0", decoded=None) -> Sample:
    """Text, image 0, text, image 1, text: each image a (1, 2, 2) grid (4 patch rows, one placeholder
    token under merge_size 2) wrapped in vision start/end tokens; patch row r holds the value r."""
    patches = np.repeat(np.arange(8, dtype=np.uint8)[:, None], 3, axis=1)
    if decoded is not None:
        patches = np.concatenate([patches[4 * i:4 * i + 4] for i in decoded])
    return Sample(key, tokens(1, START, IMAGE, END, 2, START, IMAGE, END, 3), patches,
                  np.array([1, 2, 2, 1, 2, 2], np.int32), decoded)


# -- packing and labels ------------------------------------------------------------------------


def test_a_microbatch_packs_its_samples_to_capacity_with_labels_inside_each_sample(tmp_path):
    mb = build_microbatch([Sample("a:0", tokens(1, 2, 3)), Sample("b:0", tokens(4, 5))], 8, make_cfg(tmp_path), None)
    assert mb.packed.input_ids.tolist() == [1, 2, 3, 4, 5, 0, 0, 0]  # pad_token_id 0 up to the capacity
    assert mb.packed.position_ids.tolist() == [0, 1, 2, 0, 1, 0, 0, 0]
    assert mb.packed.cu_seqlens.tolist() == [0, 3, 5] and mb.packed.num_tokens == 5
    # token 3 does not predict token 4: they are in different samples
    assert mb.labels.tolist() == [2, 3, IGNORE, 5, IGNORE, IGNORE, IGNORE, IGNORE]
    assert mb.keys == ["a:0", "b:0"]
    assert mb.pixels.dtype == np.uint8 and len(mb.pixels) == 0
    assert mb.grids.dtype == np.int32 and len(mb.grids) == 0


def test_padding_follows_pad_to_multiple_and_the_thd_slot_size(tmp_path):
    cfg = make_cfg(tmp_path, global_batch={"context_length": 16, "microbatches": 2, "tokens_per_step": 40,
                                           "pad_to_multiple": 4})
    samples = [Sample("a:0", tokens(1, 2, 3)), Sample("b:0", tokens(4, 5))]
    assert build_microbatch(samples, 16, cfg, None).packed.input_ids.tolist() == [1, 2, 3, 4, 5, 0, 0, 0]
    slotted = build_microbatch(samples, 16, cfg, None, seq_multiple=4)  # THD under cp=2: slots of 2*cp
    assert slotted.packed.input_ids.tolist() == [1, 2, 3, 0, 4, 5, 0, 0]
    assert slotted.packed.cu_seqlens_padded.tolist() == [0, 4, 8]
    assert slotted.labels.tolist() == [2, 3, IGNORE, IGNORE, 5, IGNORE, IGNORE, IGNORE]


def test_a_label_that_is_an_image_placeholder_is_ignored(tmp_path):
    sample = Sample("v:0", tokens(1, START, IMAGE, IMAGE, END, 2))
    assert build_microbatch([sample], 6, make_cfg(tmp_path), IMAGE).labels.tolist() == [
        START, IGNORE, IGNORE, END, 2, IGNORE]
    assert build_microbatch([sample], 6, make_cfg(tmp_path), None).labels.tolist() == [
        START, IMAGE, IMAGE, END, 2, IGNORE]


def test_a_loaders_loss_mask_reaches_the_labels_and_the_loss_mask_column(tmp_path):
    cfg = make_cfg(tmp_path)
    ids = pa.array([[1, 2, 3, 4], [5, 6], [7, 8, 9], [10, 11]], pa.list_(pa.int32()))
    offsets = ids.offsets.to_numpy()
    # row 1 sent no mask (its source has none); row 3's mask does not match its tokens: none either
    masks = sample_loss_masks(pa.array([[0, 0, 1, 1], [], [1, 0, 1], [1]], pa.list_(pa.uint8())), offsets)
    assert [None if masks(j) is None else masks(j).tolist() for j in range(4)] == [
        [0, 0, 1, 1], None, [1, 0, 1], None]
    values = ids.values.to_numpy()
    samples = [Sample(f"s:{j}", values[offsets[j]:offsets[j + 1]], loss_mask=masks(j)) for j in range(3)]
    mb = build_microbatch(samples, 12, cfg, None)
    # label i predicts token i+1, kept only where that token's mask is 1; the maskless sample trains on all
    assert mb.labels.tolist() == [IGNORE, 3, 4, IGNORE, 6, IGNORE, IGNORE, 9, IGNORE, IGNORE, IGNORE, IGNORE]
    table = rank_table(0, 0, [mb], Delivery(0, None), cfg)
    assert table.column("labels").to_pylist() == [mb.labels.tolist()]
    assert table.column("loss_mask").to_pylist() == [[0, 1, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0]]


def test_a_microbatch_gathers_its_samples_pixels_and_grids_in_order(tmp_path):
    first, text, second = image_sample("v:0"), Sample("t:0", tokens(9)), image_sample("v:1", decoded=(1,))
    mb = build_microbatch([first, text, second], 24, make_cfg(tmp_path), IMAGE)
    assert mb.keys == ["v:0", "t:0", "v:1"]
    assert np.array_equal(mb.pixels, np.concatenate([first.patches.reshape(-1), second.patches.reshape(-1)]))
    assert mb.grids.tolist() == [1, 2, 2] * 4  # every image's grid, the undecoded image 0 of v:1 included


# -- truncation --------------------------------------------------------------------------------


def test_truncate_cuts_a_text_sample_and_its_loss_mask(tmp_path):
    cfg = make_cfg(tmp_path)
    sample = Sample("a:0", tokens(1, 2, 3, 4, 5), loss_mask=np.array([0, 1, 1, 1, 1], np.uint8))
    cut = truncate(sample, 3, cfg)
    assert cut.key == "a:0" and cut.tokens.tolist() == [1, 2, 3] and cut.loss_mask.tolist() == [0, 1, 1]
    assert truncate(sample, 5, cfg) is sample and truncate(sample, 9, cfg) is sample


@pytest.mark.parametrize("length, kept_tokens, kept_images", [
    (9, 9, 2),
    (8, 8, 2),  # both runs end inside the cut
    (6, 5, 1),  # image 1's run would be split: dropped whole, with what follows it
    (4, 4, 1),
    (2, 1, 0),  # image 0's run would be split
])
def test_truncate_never_splits_an_image_run(tmp_path, length, kept_tokens, kept_images):
    sample = image_sample()
    cut = truncate(sample, length, make_cfg(tmp_path))
    assert cut.tokens.tolist() == sample.tokens[:kept_tokens].tolist()
    assert cut.grids.tolist() == [1, 2, 2] * kept_images
    assert cut.patches.tolist() == sample.patches[:4 * kept_images].tolist()


def test_truncate_keeps_the_decoded_images_left_of_the_cut(tmp_path):
    """Image graph: a constructor holding image 1's pixels alone loses them when the cut drops image 1."""
    cfg = make_cfg(tmp_path)
    sample = image_sample(decoded=(1,))
    whole = truncate(sample, 8, cfg)
    assert whole.decoded == (1,) and whole.patches.tolist() == sample.patches.tolist()
    cut = truncate(sample, 6, cfg)
    assert cut.decoded == () and len(cut.patches) == 0 and cut.grids.tolist() == [1, 2, 2]


# -- decode failures ---------------------------------------------------------------------------


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 30)).save(out, "PNG")
    return out.getvalue()


def test_decode_or_error_decodes_a_good_image_and_names_the_sample_of_a_bad_one(tmp_path):
    cfg = make_cfg(tmp_path)
    good = png(56, 56)
    grid = list(patch_grid(*image_size(good), cfg.vision.spec))
    sample = decode_or_error("v:0", tokens(1, 2), [good], grid, cfg)
    assert isinstance(sample, Sample) and sample.key == "v:0" and sample.grids.tolist() == grid
    assert sample.patches.shape == (np.prod(grid), 3 * cfg.vision.patch_size ** 2)
    failed = decode_or_error("v:1", tokens(1, 2), [good, b"not a picture"], grid * 2, cfg)
    assert isinstance(failed, Failed) and failed.key == "v:1" and "not an image" in failed.message
    wrong_grid = decode_or_error("v:2", tokens(1, 2), [good], [1, 2, 2], cfg)  # the header budgeted another grid
    assert isinstance(wrong_grid, Failed) and "decodes to grid" in wrong_grid.message


def test_decode_or_error_passes_text_through_and_views_a_loaders_patches(tmp_path):
    cfg = make_cfg(tmp_path, vision={"decode_at": "loader"})
    text = decode_or_error("t:0", tokens(1, 2), [], [], cfg)
    assert isinstance(text, Sample) and text.tokens.tolist() == [1, 2] and text.patches is None
    dim = 3 * cfg.vision.patch_size ** 2
    rows = np.arange(4 * dim, dtype=np.uint32).astype(np.uint8).reshape(4, dim)
    sample = decode_or_error("v:0", tokens(1), [rows[:2].tobytes(), rows[2:].tobytes()], [1, 1, 2, 1, 2, 1], cfg)
    assert np.array_equal(sample.patches, rows) and sample.grids.dtype == np.int32


def test_drop_bad_skips_failed_samples_by_key(tmp_path, caplog):
    good = Sample("a:0", tokens(1))
    with caplog.at_level(logging.ERROR, logger="flight_overlord.constructor.assembly"):
        kept, bad = drop_bad({0: good, 1: Failed("v:1", "truncated PNG"), 2: good}, make_cfg(tmp_path))
    assert kept == {0: good, 2: good} and bad == ["v:1"]
    assert "v:1" in caplog.text and "truncated PNG" in caplog.text


def test_drop_bad_stops_the_run_naming_the_sample_under_fail(tmp_path):
    cfg = make_cfg(tmp_path, vision={"on_bad_image": "fail"})
    assert drop_bad({0: Sample("a:0", tokens(1))}, cfg)[1] == []
    with pytest.raises(BadSample, match=r"sample v:1: truncated PNG \(vision.on_bad_image: fail\)"):
        drop_bad({0: Sample("a:0", tokens(1)), 1: Failed("v:1", "truncated PNG")}, cfg)


# -- each rank's share -------------------------------------------------------------------------


def packed_two_samples(seq_multiple: int = 1):
    return pack([tokens(1, 2, 3), tokens(4, 5)], 16, seq_multiple=seq_multiple)


def test_delivery_ranges_all_none_or_a_context_parallel_share():
    packed = packed_two_samples()
    assert delivery_ranges(Delivery(0, None), packed, Mesh()) == [0, 16]
    assert delivery_ranges(Delivery(0, None, frozenset()), packed, Mesh()) == []  # metadata only
    balanced, contiguous = Mesh(cp=2, cp_format="bshd"), Mesh(cp=2, cp_format="bshd", cp_split="contiguous")
    # load-balanced: chunks c and 2*cp-1-c of the buffer, one range each (rank 1's two chunks touch)
    assert [delivery_ranges(Delivery(0, c), packed, balanced) for c in (0, 1)] == [[0, 4, 12, 16], [4, 8, 8, 12]]
    assert [delivery_ranges(Delivery(0, c), packed, contiguous) for c in (0, 1)] == [[0, 8], [8, 16]]
    # THD: slots [0, 4), [4, 8) and the tail [8, 16), each cut in 2*cp chunks; rank c holds c and 3-c
    thd = packed_two_samples(seq_multiple=4)
    assert [delivery_ranges(Delivery(0, c), thd, Mesh(cp=2)) for c in (0, 1)] == [
        [0, 1, 3, 5, 7, 10, 14, 16], [1, 3, 5, 7, 10, 14]]


def test_every_rank_of_a_cp_tp_mesh_gets_its_share_and_together_the_cp_ranks_hold_the_sequence(tmp_path):
    cfg = make_cfg(tmp_path, mesh={"dp": 1, "cp": 2, "tp": 2})
    mesh = cfg.mesh
    samples = [Sample("a:0", tokens(1, 2, 3, 4, 5)), Sample("b:0", tokens(6, 7, 8))]
    mb = build_microbatch(samples, 16, cfg, None, seq_multiple=2 * mesh.cp)
    tables = {rank: rank_table(3, 0, [mb], mesh.delivery(rank, "DP", frozenset({"TP"})), cfg)
              for rank in range(mesh.world_size)}
    full = np.full(16, -1)
    for rank, table in tables.items():
        row = table.to_pylist()[0]
        assert (row["step"], row["bucket"], row["sample_keys"]) == (3, 0, ["a:0", "b:0"])
        assert row["cu_seqlens_padded"] == mb.packed.cu_seqlens_padded.tolist()
        if mesh.coord(rank).tp > 0:  # behind the TP broadcast: metadata only
            assert row["input_ids"] == row["token_ranges"] == row["labels"] == []
            continue
        ranges = row["token_ranges"]
        assert ranges == delivery_ranges(Delivery(0, mesh.coord(rank).cp), mb.packed, mesh)
        positions = np.concatenate([np.arange(s, e) for s, e in zip(ranges[::2], ranges[1::2])])
        assert row["input_ids"] == mb.packed.input_ids[positions].tolist()
        assert row["labels"] == mb.labels[positions].tolist()
        assert (full[positions] == -1).all()  # no position held twice
        full[positions] = mb.packed.input_ids[positions]
    assert full.tolist() == mb.packed.input_ids.tolist()


def test_a_pipeline_stage_gets_only_its_token_fields(tmp_path):
    cfg = make_cfg(tmp_path)
    mb = build_microbatch([image_sample()], 16, cfg, IMAGE)
    first, last = Mesh(pp=2).delivery(0), Mesh(pp=2).delivery(1)  # rank 1: the last stage
    row = rank_table(0, 0, [mb], first, cfg).to_pylist()[0]
    assert row["input_ids"] == mb.packed.input_ids.tolist() and row["pixel_values"] == mb.pixels.tolist()
    assert row["labels"] == row["loss_mask"] == []
    row = rank_table(0, 0, [mb], last, cfg).to_pylist()[0]
    assert row["labels"] == mb.labels.tolist() and row["input_ids"] == row["pixel_values"] == []
    assert row["image_grid_thw"] == mb.grids.tolist()  # grids are metadata: every stage has them


def test_rank_table_follows_the_published_microbatch_schema(tmp_path):
    cfg = make_cfg(tmp_path)
    microbatches = [build_microbatch([image_sample()], 16, cfg, IMAGE),
                    build_microbatch([Sample("a:0", tokens(1, 2)), Sample("b:0", tokens(3))], 16, cfg, IMAGE)]
    table = rank_table(7, 1, microbatches, Delivery(1, None, ALL_FIELDS), cfg)
    assert arrow_fields(table) == published_fields("microbatch")
    assert table.column("microbatch").to_pylist() == [0, 1]
    assert table.column("step").to_pylist() == [7, 7] and table.column("bucket").to_pylist() == [1, 1]
    assert table.column("sequence_length").to_pylist() == [16, 16]
    assert table.column("num_tokens").to_pylist() == [9, 3]
    assert table.column("sample_keys").to_pylist() == [["v:0"], ["a:0", "b:0"]]
    assert table.column("token_ranges").to_pylist() == [[0, 16], [0, 16]]
    assert table.column("pixel_values").to_pylist() == [microbatches[0].pixels.tolist(), []]
    # an image graph ships the pixels to the encoder ranks instead; the grids stay
    graph = rank_table(7, 1, microbatches, Delivery(1, None, ALL_FIELDS), cfg, with_pixels=False)
    assert graph.column("pixel_values").to_pylist() == [[], []]
    assert graph.column("image_grid_thw").to_pylist() == [[1, 2, 2, 1, 2, 2], []]


# -- image graph -------------------------------------------------------------------------------


def test_encoder_table_holds_one_row_per_image_with_its_owner():
    whole, second_only = image_sample("v:0"), image_sample("v:1", decoded=(1,))
    table = encoder_table(5, [(whole, 1, 2, 0), (second_only, 1, 3, 1), (whole, 0, 2, 0)])
    assert arrow_fields(table) == published_fields("encoder_batch")
    assert table.column("step").to_pylist() == [5, 5, 5]
    assert table.column("sample_key").to_pylist() == ["v:0", "v:1", "v:0"]
    assert table.column("image_index").to_pylist() == [1, 1, 0]
    assert table.column("owner_bucket").to_pylist() == [2, 3, 2]
    assert table.column("owner_microbatch").to_pylist() == [0, 1, 0]
    pixels = table.column("pixel_values").to_pylist()
    # image 1 is patch rows 4..7 of a whole sample, and all of a sample holding image 1 alone
    assert pixels[0] == pixels[1] == whole.patches[4:].reshape(-1).tolist()
    assert pixels[2] == whole.patches[:4].reshape(-1).tolist()
    assert table.column("image_grid_thw").to_pylist() == [[1, 2, 2]] * 3
    with pytest.raises(ValueError, match="sample v:1: image 0 was not decoded here"):
        image_patches(second_only, 0)


def test_shipped_images_gathers_each_items_images_from_the_encoder_rows():
    rows = {1: [[0, 2, 0, 0]], 3: [[0, 0, 0, 0], [4, 1, 1, 0]], 2: []}  # [item, image, owner bucket, owner mb]
    assert shipped_images(rows) == {0: {0, 2}, 4: {1}}
    assert shipped_images({}) == {}  # an image graph giving this constructor no encoder rows: it ships nothing
    assert shipped_images(None) is None  # no image graph: every image ships with its sequence
