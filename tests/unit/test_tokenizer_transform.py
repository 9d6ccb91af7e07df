"""The ``hf_tokenizer`` sample transform on its own, the demo tokenizer it is shipped with, and
how configs resolve its ``path``."""
from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

tokenizers = pytest.importorskip("tokenizers")

from flight_overlord.config import ConfigError, parse_config  # noqa: E402
from flight_overlord.demo import data as demo_data  # noqa: E402
from flight_overlord.demo import tokenizer as demo_tokenizer  # noqa: E402
from flight_overlord.transforms import make_transform  # noqa: E402

TEXTS = [
    "def encode(self, o):\n    \"\"\"Return a JSON string representation of a Python data structure.\"\"\"\n"
    "    return ''.join(self.iterencode(o, _one_shot=True))\n",
    "Permission is hereby granted, free of charge, to any person obtaining a copy of this software.",
    "Q: What does `json.dumps` do?\nA: Serialize ``obj`` to a JSON formatted ``str``.",
    "Ünïcödé: naïve café, 日本語のテキスト, emoji 🚀🐍, tabs\tand  double  spaces  ",
    "   leading spaces, trailing newline\n\n",
]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    demo_tokenizer.train_demo_tokenizer(TEXTS * 20, vocab_size=400).save(str(path))
    return path


@pytest.fixture(scope="module")
def tokenize(tokenizer_file):
    return make_transform("hf_tokenizer", {"path": str(tokenizer_file)})


@pytest.fixture(scope="module")
def tokenizer(tokenizer_file):
    return tokenizers.Tokenizer.from_file(str(tokenizer_file))


def _ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False).ids


def test_round_trip_decodes_to_the_text(tokenize, tokenizer):
    extra = ["a", "", "never seen: ʃʒ ∮ ⅋ 𝔘𝔫𝔦", "x" * 3000]
    out = tokenize(pa.array(TEXTS + extra, pa.string()), 1_000_000)
    assert isinstance(out, pa.ListArray) and out.type == pa.list_(pa.int32())
    assert len(out) == len(TEXTS) + len(extra) and out.null_count == 0
    for text, ids in zip(TEXTS + extra, out.to_pylist()):
        assert ids == _ids(tokenizer, text)
        assert tokenizer.decode(ids) == text
    assert len(out[0]) < len(TEXTS[0].encode()) / 2, "the BPE should merge this text well"


def test_nulls_give_empty_lists(tokenize, tokenizer):
    out = tokenize(pa.array([None, TEXTS[1], None, "", TEXTS[2]], pa.string()), 64)
    assert out.null_count == 0
    lists = out.to_pylist()
    assert lists[0] == lists[2] == lists[3] == []
    assert lists[1] == _ids(tokenizer, TEXTS[1]) and lists[4] == _ids(tokenizer, TEXTS[2])
    assert tokenize(pa.array([None, None], pa.string()), 8).to_pylist() == [[], []]


def test_truncation_keeps_the_first_tokens(tokenize, tokenizer):
    for max_tokens in (1, 3, 10):
        out = tokenize(pa.array(TEXTS, pa.string()), max_tokens).to_pylist()
        for text, ids in zip(TEXTS, out):
            full = _ids(tokenizer, text)
            assert ids == full[:max_tokens]
            assert text.startswith(tokenizer.decode(ids).rstrip("\ufffd"))  # a cut multi-byte char
    assert tokenize(pa.array(TEXTS, pa.string()), 0).to_pylist() == [[]] * len(TEXTS)


def test_empty_column(tokenize):
    for column in (pa.array([], pa.string()), pa.chunked_array([], pa.string())):
        out = tokenize(column, 16)
        assert isinstance(out, pa.ListArray) and out.type == pa.list_(pa.int32()) and len(out) == 0


def test_sliced_chunked_and_large_string_columns(tokenize):
    expected = tokenize(pa.array(TEXTS, pa.string()), 32)
    assert tokenize(pa.array(TEXTS, pa.large_string()), 32).equals(expected)
    assert tokenize(pa.chunked_array([TEXTS[:2], TEXTS[2:]], pa.string()), 32).equals(expected)
    assert tokenize(pa.array([None] + TEXTS, pa.string()).slice(2, 3), 32).equals(expected.slice(1, 3))
    # An image-text source tokenizes the segment values of a list<string> column, nulls at images.
    segments = pa.array([[TEXTS[0], None], [None, TEXTS[1]]], pa.list_(pa.string()))
    assert tokenize(segments.values, 32).to_pylist() == [expected[0].as_py(), [], [], expected[1].as_py()]


def test_bad_tokenizer_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="nope.json"):
        make_transform("hf_tokenizer", {"path": str(tmp_path / "nope.json")})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        make_transform("hf_tokenizer", {"path": str(tmp_path / "bad.json")})


def test_without_the_tokenizers_package(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    with pytest.raises(ValueError, match="pip install tokenizers"):
        make_transform("hf_tokenizer", {"path": "tokenizer.json"})
    written = demo_data.make_demo_data(tmp_path, seed=0, scale=0.01, images=False)
    assert tuple(written) == demo_data.SOURCE_NAMES and all(p.is_file() for ps in written.values() for p in ps)
    assert not (tmp_path / "tokenizer.json").exists()
    assert "'tokenizers' package is not installed" in capsys.readouterr().err


def test_demo_tokenizer_is_deterministic_and_byte_level():
    texts = {"a": TEXTS * 10, "b": [t.upper() for t in TEXTS] * 10}
    sample = demo_tokenizer._tokenizer_sample(texts, budget=4000)
    assert 4000 <= sum(len(t.encode()) for t in sample) < 4000 + 2 * max(len(t.encode()) for t in TEXTS)
    first = demo_tokenizer.train_demo_tokenizer(sample, vocab_size=300)
    second = demo_tokenizer.train_demo_tokenizer(sample, vocab_size=300)
    assert first.to_str() == second.to_str()
    assert first.token_to_id("<|endoftext|>") == 0   # the configs' default pad_token_id
    assert first.get_vocab_size() == 300
    text = "bytes it never saw: \x01\x7f ü ☃ 🎉"
    assert first.decode(first.encode(text).ids) == text


def _source_dir(tmp_path):
    (tmp_path / "src").mkdir()
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "src" / "part-0.parquet")
    (tmp_path / "tokenizer.json").write_text("{}")


def _config(transform):
    return {"sources": [{"name": "s", "paths": "src/*.parquet", "transform": transform}],
            "global_batch": {"context_length": 64, "samples_per_step": 2}, "data_root": "data"}


def test_config_resolves_the_tokenizer_path_against_data_root(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _source_dir(data)
    cfg = parse_config(_config({"name": "hf_tokenizer", "path": "tokenizer.json"}), base_dir=tmp_path)
    assert cfg.sources[0].transform.name == "hf_tokenizer"
    assert cfg.sources[0].transform.options == {"path": str((data / "tokenizer.json").resolve())}
    (tmp_path / "elsewhere").mkdir()
    absolute = str((tmp_path / "elsewhere" / "tok.json").resolve())   # outside data_root: kept as is
    (tmp_path / "elsewhere" / "tok.json").write_text("{}")
    cfg = parse_config(_config({"name": "hf_tokenizer", "path": absolute, "add_special_tokens": True}),
                       base_dir=tmp_path)
    assert cfg.sources[0].transform.options == {"path": absolute, "add_special_tokens": True}
    assert parse_config(_config("byte_tokenizer"), base_dir=tmp_path).sources[0].transform.options == {}


def test_config_names_a_missing_tokenizer_file(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _source_dir(data)
    with pytest.raises(ConfigError, match=r"sources\[0\]\.transform\.path: file not found: .*missing\.json"):
        parse_config(_config({"name": "hf_tokenizer", "path": "missing.json"}), base_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"sources\[0\]\.transform\.path: expected a file path"):
        parse_config(_config({"name": "hf_tokenizer", "path": 3}), base_dir=tmp_path)


def test_buffered_tokens_are_compact_and_served_back_as_int32():
    """A loader buffers token ids in the narrowest type that holds them; widening gives back exactly
    the tokenizer's int32 lists (the byte tokenizer's ids fit uint8; a wide vocabulary is kept as is)."""
    from flight_overlord.loader.row_groups import compact_tokens
    from flight_overlord.transforms import make_transform
    tokens = make_transform("byte_tokenizer")(pa.array(["héllo wörld", None, "ab" * 40]), 16)
    small = compact_tokens(tokens)
    assert small.type == pa.list_(pa.uint8()) and small.nbytes < tokens.nbytes
    assert small.cast(tokens.type).equals(tokens)
    mid = pa.array([[1, 300], [], [65535]], pa.list_(pa.int32()))
    assert compact_tokens(mid).type == pa.list_(pa.uint16()) and compact_tokens(mid).cast(mid.type).equals(mid)
    wide = pa.array([[1, 70000]], pa.list_(pa.int32()))
    assert compact_tokens(wide) is wide
    sliced = pa.array([[1, 2], [7, 8, 9]], pa.list_(pa.int32()))[1:]
    assert compact_tokens(sliced).cast(sliced.type).to_pylist() == [[7, 8, 9]]
