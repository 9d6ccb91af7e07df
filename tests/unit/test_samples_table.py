"""One table for the picks of several loader actors (``loader/samples_table.py``): what a loader
process sends for a call naming several actors equals each actor's own answer, back to back."""
from __future__ import annotations

import pyarrow as pa
import pytest

from flight_overlord.config import load_config
from flight_overlord.loader.actor import LoaderActor
from flight_overlord.loader.row_groups import SourceShare
from flight_overlord.loader.samples_table import samples_table

from ..corpora import write_pretokenized
from ..helpers import IMAGE_BATCH, IMAGE_SOURCES, write_config


def _actors(cfg, run_dir, pool=None) -> list[LoaderActor]:
    return [LoaderActor(SourceShare(s, 0, cfg.global_batch.context_length, cfg.vision), seed=cfg.seed,
                        read_ahead=1, run_dir=run_dir, replicated=False, pool=pool) for s in cfg.sources]


@pytest.mark.parametrize("sources", ["text", "image_text", "loss_mask"])
def test_one_table_for_several_actors_is_their_own_tables_back_to_back(corpus, tmp_path, sources):
    """What a loader process sends for a call naming several actors (their picks, one table) equals each
    actor's own answer, in the order asked: rows of several row groups, interleaved, text, images and
    pre-tokenized rows with a loss mask beside text."""
    extra = {"image_text": {"sources": IMAGE_SOURCES, "global_batch": IMAGE_BATCH, "vision": {"max_pixels": 200704}},
             "loss_mask": {"sources": [
                 {"name": "sft", "paths": str(tmp_path / "sft" / "*.parquet"), "tokens_column": "input_ids",
                  "loss_mask_column": "loss_mask", "weight": 0.5},
                 {"name": "captions", "paths": "captions/*.parquet", "weight": 0.5}]}}.get(sources, {})
    if sources == "loss_mask":
        write_pretokenized(tmp_path / "sft")
    cfg = load_config(write_config(tmp_path, corpus, **extra))
    alone, together = _actors(cfg, tmp_path / "alone"), _actors(cfg, tmp_path / "together")
    try:
        asked = []
        for actor in alone:
            first, second = actor._at(0), actor._at(1)
            asked.append([[0, rg.file, rg.row_group, row] for row in (2, 0, 1) for rg in (second, first)
                          if row < rg.num_rows])
        expected = pa.concat_tables([a.samples(5, 0, rows) for a, rows in zip(alone, asked)])
        picked = [row for a, rows in zip(together, asked) for row in a.pick(5, 0, rows)]
        got = samples_table(picked)
        assert got.num_rows == sum(map(len, asked)) and got.equals(expected)
        if sources != "text":  # the columns that text rows leave empty are filled for the others
            column = "images" if sources == "image_text" else "loss_mask"
            assert sum(len(x) for x in got.column(column).to_pylist()) > 0
        for a, b in zip(alone, together):  # the pops are journaled the same
            assert a.state.state_dict() == b.state.state_dict()
    finally:
        for actor in alone + together:
            actor.close()
