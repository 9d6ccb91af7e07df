"""A source's files in their own formats: chunk files (Parquet, Arrow IPC file and stream, Hugging Face
folders), pre-tokenized columns and loss masks, the labels they make, plugins, and the column checks."""
from __future__ import annotations

import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from flight_overlord import formats
from flight_overlord.config import ConfigError, load_config
from flight_overlord.constructor.assembly import Sample, build_microbatch
from flight_overlord.core.cost import COST_MODELS
from flight_overlord.core.packing import pack, shifted_labels
from flight_overlord.deploy.precheck import check_data
from flight_overlord.loader.row_groups import SourceShare, read_catalog
from flight_overlord.transforms import TRANSFORMS
from flight_overlord.transforms.pretokenized import loss_masks, token_lists

from ..corpora import (
    convert,
    megatron_row,
    row_of,
    write_feather,
    write_hf_datasets,
    write_jsonl_zst,
    write_megatron,
    write_pretokenized,
    write_webdataset,
)


def config(tmp_path, sources, **top) -> str:
    raw = {"data_root": str(tmp_path), "run_dir": str(tmp_path / "run"), "sources": sources,
           "global_batch": {"context_length": 256, "tokens_per_step": 1024}, **top}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_every_chunk_file_reads_the_rows_pyarrow_reads(tmp_path):
    table = pa.table({"text": [f"row {i}" for i in range(37)]})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=10)
    with pa.ipc.new_file(tmp_path / "b.arrow", table.schema) as w:
        for batch in table.to_batches(max_chunksize=10):
            w.write_batch(batch)
    with pa.ipc.new_stream(tmp_path / "c.arrow", table.schema) as w:
        for batch in table.to_batches(max_chunksize=10):
            w.write_batch(batch)
    for name in ("a.parquet", "b.arrow", "c.arrow"):
        with formats.open_chunks(str(tmp_path / name)) as opened:
            assert [opened.chunk_rows(i) for i in range(opened.num_chunks)] == [10, 10, 10, 7], name
            rows = [r for i in range(opened.num_chunks) for r in opened.read(i, ["text"]).column(0).to_pylist()]
            assert rows == table.column("text").to_pylist(), name
            assert opened.schema.field("text").type == pa.string()
    assert formats.format_of("x/y.feather") == "arrow" and formats.format_of("x/part-0") == "parquet"
    assert formats.format_of("x/y.arrow", "parquet") == "parquet"


def test_a_hugging_face_folder_is_its_state_files_in_order(tmp_path):
    write_hf_datasets(tmp_path / "hf", files=3, batches=2, rows=5)
    cfg = load_config(config(tmp_path, [{"name": "hf", "paths": "hf"}]))
    assert [f.rsplit("/", 1)[1] for f in cfg.sources[0].files] == [f"data-{i:05d}-of-00003.arrow" for i in range(3)]
    catalog = read_catalog(cfg.sources[0])
    assert len(catalog) == 6 and all(rg.num_rows == 5 for rg in catalog)
    share = SourceShare(cfg.sources[0], 0, 256)
    rg = catalog[3]
    got = share.read(rg).tokens.to_pylist()
    want = [list(row_of(tmp_path, f"hf:{rg.file}:{rg.row_group}:{i}", ["text"])["text"].encode()[:256])
            for i in range(rg.num_rows)]
    assert got == want
    share.close()


def test_pretokenized_columns_of_any_integer_list_type(tmp_path):
    for t in (pa.int8(), pa.uint16(), pa.int64(), pa.uint64()):
        column = pa.array([[1, 2, 3], [4], None, [], [5, 6, 7, 8]], pa.large_list(t))
        assert token_lists(column, 3, "ids").to_pylist() == [[1, 2, 3], [4], [], [], [5, 6, 7]]
    fixed = pa.FixedSizeListArray.from_arrays(pa.array([1, 2, 3, 4], pa.int16()), 2)
    assert token_lists(fixed, 5, "ids").to_pylist() == [[1, 2], [3, 4]]
    with pytest.raises(ValueError, match=r"column 'ids': token ids must be in \[0, 2147483647\], found -2"):
        token_lists(pa.array([[1, -2]]), 5, "ids")
    tokens = pa.array([[1, 2, 3], [4, 5]])
    masks = pa.array([[False, True, True], [True, False]])
    assert loss_masks(masks, tokens, 2, "m").to_pylist() == [[0, 1], [1, 0]]
    with pytest.raises(ValueError, match="column 'm': row 1 has 1 loss-mask values for 2 tokens"):
        loss_masks(pa.array([[0, 1, 1], [1]]), tokens, 5, "m")


def test_a_loss_mask_drops_the_labels_of_untrained_targets():
    a, b = np.array([10, 11, 12, 13], np.int32), np.array([20, 21, 22], np.int32)
    mask_a, mask_b = np.array([0, 0, 1, 1], np.uint8), np.array([1, 0, 1], np.uint8)
    packed = pack([a, b], 12)
    plain = shifted_labels(packed, None)
    assert plain.tolist() == [11, 12, 13, -100, 21, 22, -100] + [-100] * 5
    mb = build_microbatch([Sample("s:f:0:0", a, loss_mask=mask_a), Sample("s:f:0:1", b, loss_mask=mask_b)], 12,
                          _cfg_stub(), None)
    # label i predicts token i+1: kept where that token's mask is 1
    assert mb.labels.tolist() == [-100, 12, 13, -100, -100, 22, -100] + [-100] * 5
    unmasked = build_microbatch([Sample("s:f:0:0", a), Sample("s:f:0:1", b, loss_mask=mask_b)], 12, _cfg_stub(), None)
    assert unmasked.labels.tolist() == [11, 12, 13, -100, -100, 22, -100] + [-100] * 5


def _cfg_stub():
    class GlobalBatch:
        pad_to_multiple = None

    class Cfg:
        pad_token_id = 0
        global_batch = GlobalBatch()
    return Cfg()


def test_a_pretokenized_source_reads_ids_and_masks(tmp_path):
    write_pretokenized(tmp_path / "sft", files=1, row_groups=2, rows=4, id_type=pa.uint32(), mask_type=pa.bool_())
    cfg = load_config(config(tmp_path, [{"name": "sft", "paths": "sft/*.parquet", "tokens_column": "input_ids",
                                         "loss_mask_column": "loss_mask"}]))
    share = SourceShare(cfg.sources[0], 0, 100)
    rg = read_catalog(cfg.sources[0])[1]
    read = share.read(rg)
    for i in range(rg.num_rows):
        row = row_of(tmp_path, f"sft:{rg.file}:{rg.row_group}:{i}", ["input_ids", "loss_mask"])
        assert read.tokens[i].as_py() == row["input_ids"][:100]
        assert read.loss_mask[i].as_py() == [int(m) for m in row["loss_mask"][:100]]
    share.close()


def test_source_keys_that_contradict_are_refused(tmp_path):
    write_pretokenized(tmp_path / "sft", files=1, row_groups=1, rows=2)
    base = {"name": "sft", "paths": "sft/*.parquet"}
    for extra, message in [({"tokens_column": "input_ids", "transform": "byte_tokenizer"},
                            r"sources\[0\].transform: a pre-tokenized source \(tokens_column\) takes no transform"),
                           ({"loss_mask_column": "loss_mask"}, r"sources\[0\].loss_mask_column: needs tokens_column"),
                           ({"format": "csv"}, r"sources\[0\].format: 'csv' is not one of auto, parquet, arrow"),
                           ({"transform": "nope"}, r"sources\[0\].transform: unknown transform 'nope' \(registered: "
                                                   r"byte_tokenizer, hf_tokenizer")]:
        with pytest.raises(ConfigError, match=message):
            load_config(config(tmp_path, [{**base, **extra}]))


def test_the_check_before_start_names_source_file_and_column(tmp_path):
    write_pretokenized(tmp_path / "sft", files=2, row_groups=1, rows=2)
    file = tmp_path / "sft" / "shard-0.parquet"
    for source, message in [
            ({"text_column": "input_ids"}, f"source 'sft': column 'input_ids' of file {file} is list<element: int32>, "
                                           f"expected string"),
            ({"tokens_column": "ids"},
             f"source 'sft': file {file} has no column 'ids' (columns: input_ids, loss_mask)"),
            ({"tokens_column": "input_ids", "loss_mask_column": "mask"}, "has no column 'mask'")]:
        cfg = load_config(config(tmp_path, [{"name": "sft", "paths": "sft/*.parquet", **source}]))
        with pytest.raises(ConfigError) as info:
            check_data(cfg)
        assert message in str(info.value) and "\n" not in str(info.value)
    check_data(load_config(config(tmp_path, [{"name": "sft", "paths": "sft/*.parquet", "tokens_column": "input_ids"}])))


PLUGIN = textwrap.dedent('''
    import pyarrow as pa
    import pyarrow.compute as pc
    from flight_overlord.transforms import TRANSFORMS, register_transform
    from flight_overlord.core.cost import register_cost_model

    @register_transform("unit_bytes_plus_one")
    def bytes_plus_one():
        byte = TRANSFORMS["byte_tokenizer"]()
        def tokenize(column, max_tokens):
            t = byte(column, max_tokens)
            return pa.ListArray.from_arrays(t.offsets, pc.add(t.values, 1))
        return tokenize

    @register_cost_model("unit_cost_" + __name__[-4:])  # one per plugin module: each test's file is its own
    def square(a=1.0, b=0.0):
        return lambda meta: pa.array(meta["num_tokens"]).to_numpy() ** 2
    ''')


def test_plugins_register_once_and_unknown_names_list_the_registered(tmp_path):
    write_feather(tmp_path / "f" / "a.feather", rows=8)
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "mine.py").write_text(PLUGIN)
    sources = [{"name": "f", "paths": "f/*.feather", "transform": "unit_bytes_plus_one"}]
    for _ in range(2):  # a config read twice in a process registers once
        cfg = load_config(config(tmp_path, sources, plugins=["plugins/mine.py"]))
    assert "unit_bytes_plus_one" in TRANSFORMS and cfg.plugins == (str(tmp_path / "plugins" / "mine.py"),)
    share = SourceShare(cfg.sources[0], 0, 64)
    read = share.read(read_catalog(cfg.sources[0])[0])
    text = row_of(tmp_path, "f:f/a.feather:0:0", ["text"])["text"]
    assert read.tokens[0].as_py() == [b + 1 for b in text.encode()[:64]]
    share.close()
    (tmp_path / "plugins" / "broken.py").write_text("raise RuntimeError('my bug')\n")
    for plugins, message in [(["plugins/missing.py"], r"plugins\[0\]: file not found: .*missing.py"),
                             (["no_such_module_xyz"], r"plugins\[0\]: no module named 'no_such_module_xyz'"),
                             (["plugins/broken.py"], r"plugins\[0\]: cannot import .*broken.py: RuntimeError: my bug"),
                             ("mine.py", r"plugins: expected a list")]:
        with pytest.raises(ConfigError, match=message):
            load_config(config(tmp_path, sources, plugins=plugins))
    with pytest.raises(ConfigError, match=r"cost.model: 'mine' is not one of tokens, attention, patches"):
        load_config(config(tmp_path, sources, cost={"model": "mine"}))
    mine = next(name for name in COST_MODELS if name.startswith("unit_cost_"))
    assert load_config(config(tmp_path, sources, plugins=["plugins/mine.py"], cost={"model": mine})).cost.model == mine


def test_a_module_plugin_is_found_beside_the_config(tmp_path):
    write_feather(tmp_path / "f" / "a.feather", rows=8)
    (tmp_path / "unit_mod_plugin.py").write_text(PLUGIN.replace("unit_bytes_plus_one", "unit_module_transform"))
    cfg = load_config(config(tmp_path, [{"name": "f", "paths": "f/*.feather", "transform": "unit_module_transform"}],
                             plugins=["unit_mod_plugin"]))
    assert cfg.sources[0].transform.name == "unit_module_transform"


def test_convert_writes_row_groups_of_the_size_asked(tmp_path):
    write_jsonl_zst(tmp_path / "in.jsonl.zst", rows=300)
    convert([tmp_path / "in.jsonl.zst"], tmp_path / "out", "--row-group-bytes", "4096", "--row-groups-per-file", "3",
            "--columns", "text")
    files = sorted((tmp_path / "out").glob("part-*.parquet"))
    metas = [pq.read_metadata(f) for f in files]
    assert len(files) > 1 and all(m.num_row_groups <= 3 for m in metas)
    assert sum(m.num_rows for m in metas) == 300 and pq.read_schema(files[0]).names == ["text"]
    import json
    import subprocess
    lines = subprocess.run(["zstd", "-dc", str(tmp_path / "in.jsonl.zst")], capture_output=True, check=True).stdout \
        if __import__("shutil").which("zstd") else None
    if lines is not None:
        assert [json.loads(x)["text"] for x in lines.decode().splitlines()] == \
               [t for f in files for t in pq.read_table(f).column("text").to_pylist()]


def test_document_separators_are_off_by_default_and_fit_the_context():
    from flight_overlord.transforms import make_transform
    texts = pa.array(["ab", None, "abcdef"])
    assert make_transform("byte_tokenizer")(texts, 4).to_pylist() == [[97, 98], [], [97, 98, 99, 100]]
    with_both = make_transform("byte_tokenizer", {"bos_token_id": 300, "eos_token_id": 301})(texts, 5)
    # the EOS only where the whole document fits with it: a cut document did not end there
    assert with_both.to_pylist() == [[300, 97, 98, 301], [300, 301], [300, 97, 98, 99, 100]]
    with pytest.raises(ValueError, match="eos_token_id: expected a token id"):
        make_transform("byte_tokenizer", {"eos_token_id": -1})


def test_a_strategy_naming_an_unknown_balancer_is_refused_before_start(tmp_path):
    write_feather(tmp_path / "f" / "a.feather", rows=8)
    (tmp_path / "s.py").write_text("def build(s):\n    return s.cost('attention').balance('no_such_balancer')\n")
    cfg = load_config(config(tmp_path, [{"name": "f", "paths": "f/*.feather"}], strategy="s.py"))
    with pytest.raises(ConfigError, match=r"strategy file .*s.py: build\(\): .*'no_such_balancer'.*greedy"):
        check_data(cfg)


def test_a_megatron_indexed_dataset_is_read_in_place(tmp_path):
    from flight_overlord.formats.megatron import MegatronIndexed
    write_megatron(tmp_path / "mg" / "corpus_text_document", sequences=1200)
    cfg = load_config(config(tmp_path, [{"name": "mg", "paths": "mg/*.bin", "tokens_column": "input_ids"}]))
    catalog = read_catalog(cfg.sources[0])
    assert len(catalog) > 1 and sum(rg.num_rows for rg in catalog) == 1200  # chunks of about 1 MiB
    share = SourceShare(cfg.sources[0], 0, 4096)
    for rg in catalog:
        tokens = share.read(rg).tokens
        assert [tokens[i].as_py() for i in (0, rg.num_rows - 1)] == \
            [megatron_row(tmp_path / rg.file, rg.row_group, i) for i in (0, rg.num_rows - 1)]
    share.close()
    (tmp_path / "bad.idx").write_bytes(b"not an index at all, not at all, no")
    (tmp_path / "bad.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="not a Megatron index"):
        MegatronIndexed(str(tmp_path / "bad.bin"))


def test_convert_turns_webdataset_shards_into_rows_per_sample(tmp_path):
    shards = [[{"__key__": f"s{k}/{i:04d}", "txt": f"caption {k} {i}".encode(), "jpg": bytes([k, i, 255]) * 5,
                **({"json": b'{"w": 3}'} if i % 2 else {})} for i in range(20)] for k in range(2)]
    write_webdataset(tmp_path / "a.tar", shards[0])
    write_webdataset(tmp_path / "b.tar.gz", shards[1])
    convert([tmp_path / "a.tar", tmp_path / "b.tar.gz"], tmp_path / "out", "--columns", "__key__,txt,jpg")
    table = pq.read_table(sorted((tmp_path / "out").glob("part-*.parquet")))
    assert table.column("__key__").to_pylist() == [s["__key__"] for shard in shards for s in shard]
    assert table.column("txt").to_pylist() == [s["txt"].decode() for shard in shards for s in shard]
    assert table.column("jpg").to_pylist() == [s["jpg"] for shard in shards for s in shard]
    convert([tmp_path / "a.tar"], tmp_path / "all")
    whole = pq.read_table(sorted((tmp_path / "all").glob("part-*.parquet")))
    assert whole.column("json").to_pylist() == [('{"w": 3}' if i % 2 else None) for i in range(20)]


def test_convert_reads_mds_datasets_as_streamings_own_writer_wrote_them(tmp_path):
    """``tests/fixtures/mds``: 40 samples written by MosaicML Streaming's ``MDSWriter`` (its ``make.py``
    says how), in shards of 2 KiB, raw and zstd-compressed; ``expected.json`` is what was written."""
    import json
    from pathlib import Path

    from flight_overlord.formats.convert import convert_files
    from flight_overlord.formats.mds import read_mds
    fixtures = Path(__file__).parents[1] / "fixtures" / "mds"
    expected = json.loads((fixtures / "expected.json").read_text())
    for compression in ("plain", "zstd"):
        table = read_mds(str(fixtures / compression))
        assert table.schema.field("input_ids").type == pa.list_(pa.int32())
        assert [{**row, "meta": json.loads(row["meta"]), "raw": row["raw"].hex()} for row in table.to_pylist()] \
            == expected
    convert([fixtures / "zstd"], tmp_path / "out", "--columns", "text,input_ids", "--row-group-bytes", "1024")
    files = sorted((tmp_path / "out").glob("part-*.parquet"))
    assert sum(pq.read_metadata(f).num_row_groups for f in files) > 1
    table = pq.read_table(files)
    assert table.column("input_ids").to_pylist() == [row["input_ids"] for row in expected]
    assert table.column("text").to_pylist() == [row["text"] for row in expected]
    (tmp_path / "not-mds").mkdir()
    with pytest.raises(ConfigError, match="a folder is read as an MDS dataset when it holds index.json"):
        convert_files([str(tmp_path / "not-mds")], tmp_path / "out2", progress=False)


def test_an_mds_ndarray_names_its_dtype_and_shape_in_the_encoding_or_in_each_value():
    from flight_overlord.formats.mds import _ndarray
    values = np.array([5, 70000, 3], np.int64)
    dynamic = bytes([65, 1 << 2 | 0, 3]) + values.tobytes()  # int64, 1 dimension of uint8 sizes: 3
    assert _ndarray(dynamic, "", "ids").tolist() == [5, 70000, 3]
    assert _ndarray(dynamic[1:], "int64", "ids").tolist() == [5, 70000, 3]
    assert _ndarray(values.tobytes(), "int64:3", "ids").tolist() == [5, 70000, 3]
    with pytest.raises(ValueError, match="column 'img': an ndarray of 2 dimensions"):
        _ndarray(bytes([8, 2 << 2 | 0, 2, 2]) + bytes(4), "", "img")
