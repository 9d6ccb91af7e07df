"""End to end with a real subword tokenizer: the demo corpus's byte-level BPE (tokenizer.json,
written by make_demo_data) through the ``hf_tokenizer`` transform at the loaders, packed by the
constructors, fetched by trainer ranks; every delivered sample decodes back to its Parquet text."""
from __future__ import annotations

import collections

import numpy as np
import pyarrow.parquet as pq
import pytest

tokenizers = pytest.importorskip("tokenizers")

from flight_overlord.config import load_config  # noqa: E402

from ..helpers import WEIGHTS, fetch_run, write_config  # noqa: E402

STEPS = 4
TRANSFORM = {"name": "hf_tokenizer", "path": "tokenizer.json"}  # relative to data_root: the corpus


@pytest.fixture(scope="module")
def bpe_run(corpus, tmp_path_factory):
    sources = [{"name": n, "paths": f"{n}/*.parquet", "weight": w, "transform": TRANSFORM}
               for n, w in WEIGHTS.items()]
    path = write_config(tmp_path_factory.mktemp("bpe"), corpus, sources=sources)
    return path, fetch_run(path, steps=STEPS)


def test_delivered_ids_decode_to_the_parquet_text(bpe_run, corpus):
    path, run = bpe_run
    cfg = load_config(path)
    assert cfg.sources[0].transform.options["path"] == str(corpus.resolve() / "tokenizer.json")
    L = cfg.global_batch.context_length
    tokenizer = tokenizers.Tokenizer.from_file(str(corpus / "tokenizer.json"))
    samples = {}
    for r in run:
        assert len(run[r]) == STEPS
        for table in run[r]:
            for row in table.to_pylist():
                ids, cu = np.array(row["input_ids"]), row["cu_seqlens"]
                assert (ids[row["num_tokens"]:] == cfg.pad_token_id).all()
                for key, start, end in zip(row["sample_keys"], cu[:-1], cu[1:]):
                    assert key not in samples, f"{key} delivered twice"
                    samples[key] = ids[start:end].tolist()
    assert len(samples) > 50
    assert set(k.split(":")[0] for k in samples) == set(WEIGHTS)

    files: dict[str, pq.ParquetFile] = {}
    truncated = collections.Counter()
    whole_bytes = whole_tokens = 0
    for key, ids in samples.items():
        source, file, rg, row = key.split(":")
        if file not in files:
            files[file] = pq.ParquetFile(corpus / file)
        text = files[file].read_row_group(int(rg), columns=["text"]).column(0)[int(row)].as_py()
        assert 0 < len(ids) <= L, key
        assert max(ids) < tokenizer.get_vocab_size(), key
        assert ids == tokenizer.encode(text, add_special_tokens=False).ids[:L], key
        decoded = tokenizer.decode(ids)
        if len(ids) < L:
            assert decoded == text, key
            whole_bytes += len(text.encode("utf-8"))
            whole_tokens += len(ids)
        else:  # truncated at context_length: a prefix (its last character may be cut mid-bytes)
            assert text.startswith(decoded.rstrip("\ufffd")), key
            truncated[source] += 1
    # A subword tokenizer: several bytes per token (the byte tokenizer has exactly one).
    assert whole_bytes / whole_tokens > 2.5, whole_bytes / whole_tokens
    print(f"{len(samples)} samples, {sum(truncated.values())} truncated at {L} tokens {dict(truncated)}, "
          f"{whole_bytes / whole_tokens:.2f} bytes/token")
