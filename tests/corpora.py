"""Small corpora in the formats a team already has (pre-tokenized Parquet with a loss mask, a Hugging
Face ``datasets`` folder of IPC stream files, Feather, JSON Lines made Parquet by ``overlord convert``),
and what a sample of them must hold, read back from the files by its key."""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq

TEXTS = ["the quick brown fox", "jumps over", "a lazy dog " * 9, "", "pack my box with five dozen liquor jugs " * 3]


def texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"{seed}-{i} " + TEXTS[int(rng.integers(len(TEXTS)))] * int(rng.integers(1, 6)) for i in range(n)]


def write_pretokenized(folder: pathlib.Path, *, files: int = 3, row_groups: int = 4, rows: int = 16, seed: int = 0,
                       id_type=pa.int32(), mask_type=pa.int8()) -> None:
    """``input_ids``: token ids (list of ``id_type``); ``loss_mask``: 0 on each row's prompt, 1 after it."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        with pq.ParquetWriter(folder / f"shard-{f}.parquet", pa.schema([("input_ids", pa.list_(id_type)),
                                                                        ("loss_mask", pa.list_(mask_type))])) as w:
            for _ in range(row_groups):
                lengths = rng.integers(8, 400, size=rows)
                ids = [rng.integers(1, 32000, size=n) for n in lengths]
                masks = [(np.arange(n) >= rng.integers(0, n)).astype(np.int8) for n in lengths]
                as_mask = (lambda m: m.astype(bool).tolist()) if mask_type == pa.bool_() else (lambda m: m.tolist())
                w.write_table(pa.table({"input_ids": pa.array([i.tolist() for i in ids], pa.list_(id_type)),
                                        "loss_mask": pa.array([as_mask(m) for m in masks], pa.list_(mask_type))}))


def write_hf_datasets(folder: pathlib.Path, *, files: int = 2, batches: int = 4, rows: int = 16, seed: int = 1) -> None:
    """A ``save_to_disk`` folder: IPC *stream* files named by ``state.json``, record batches of ``rows``."""
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data-{f:05d}-of-{files:05d}.arrow" for f in range(files)]
    for f, name in enumerate(names):
        table = pa.table({"text": texts(batches * rows, seed * 100 + f), "id": list(range(batches * rows))})
        with pa.ipc.new_stream(folder / name, table.schema) as w:
            for batch in table.to_batches(max_chunksize=rows):
                w.write_batch(batch)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names],
                                                   "_fingerprint": "0", "_split": "train"}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {"text": {"dtype": "string"}}}))


def write_feather(path: pathlib.Path, *, rows: int = 64, seed: int = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    feather.write_feather(pa.table({"text": texts(rows, seed)}), path, chunksize=16)


def write_jsonl_zst(path: pathlib.Path, *, rows: int = 200, seed: int = 3) -> None:
    """JSON Lines compressed by the ``zstd`` command when there is one (else pyarrow's zstd codec)."""
    lines = "".join(json.dumps({"text": t, "meta": {"n": i}}) + "\n" for i, t in enumerate(texts(rows, seed)))
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = path.with_suffix("")
    raw.write_text(lines)
    if shutil.which("zstd"):
        subprocess.run(["zstd", "-q", "-f", str(raw), "-o", str(path)], check=True)
    else:
        with pa.output_stream(str(path), compression="zstd") as out:
            out.write(lines.encode())
    raw.unlink()


def convert(inputs: list[pathlib.Path], out: pathlib.Path, *extra: str) -> None:
    """``overlord convert`` as a user runs it."""
    subprocess.run([sys.executable, "-m", "flight_overlord.deploy.cli", "convert", *map(str, inputs), "--out", str(out),
                    "--quiet", *extra], check=True, capture_output=True, timeout=120)


def row_of(root: pathlib.Path, key: str, columns: list[str]) -> dict:
    """The row a sample key names (``source:file:chunk:row``), read with pyarrow alone."""
    _, file, chunk, row = key.rsplit(":", 3)
    path = root / file
    if path.suffix == ".bin":
        return {"input_ids": megatron_row(path, int(chunk), int(row))}
    if path.suffix == ".parquet":
        table = pq.ParquetFile(path).read_row_group(int(chunk), columns=columns)
    else:
        with pa.memory_map(str(path)) as source:
            head = source.read(6)
            source.seek(0)
            reader = pa.ipc.open_file(source) if head == b"ARROW1" else pa.ipc.open_stream(source)
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)] if head == b"ARROW1" \
                else list(reader)
            table = pa.Table.from_batches([batches[int(chunk)]]).select(columns)
    return table.slice(int(row), 1).to_pylist()[0]


PLUGIN_TRANSFORM = "shifted_bytes"
PLUGIN_SOURCE = '''"""A user's own transform, named by a config's plugins: (tests/corpora.py)."""
import pyarrow as pa
import pyarrow.compute as pc

from flight_overlord.transforms import TRANSFORMS, register_transform


@register_transform("shifted_bytes")
def shifted_bytes(shift: int = 1):
    byte = TRANSFORMS["byte_tokenizer"]()

    def tokenize(column, max_tokens):
        tokens = byte(column, max_tokens)
        return pa.ListArray.from_arrays(tokens.offsets, pc.add(tokens.values, shift))
    return tokenize
'''


def shifted_bytes(text: str, shift: int, max_tokens: int) -> list[int]:
    """What the plugin makes of a text."""
    return [b + shift for b in text.encode()[:max_tokens]]


MEGATRON_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.uint16: 8}


def write_megatron(prefix: pathlib.Path, *, sequences: int = 300, seed: int = 4, dtype=np.uint16) -> None:
    """``PREFIX.bin`` / ``PREFIX.idx`` as Megatron-LM's ``IndexedDatasetBuilder`` writes them (one sequence
    per document): the tokens back to back; the index's magic, version 1, dtype code, counts, then the
    int32 lengths, int64 byte offsets and int64 document index."""
    rng = np.random.default_rng(seed)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    lengths = rng.integers(1, 2000, size=sequences).astype(np.int32)
    tokens = rng.integers(0, 30000, size=int(lengths.sum())).astype(dtype)
    tokens.tofile(f"{prefix}.bin")
    pointers = (np.concatenate([[0], np.cumsum(lengths)[:-1]]) * np.dtype(dtype).itemsize).astype(np.int64)
    documents = np.arange(sequences + 1, dtype=np.int64)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([MEGATRON_CODES[dtype]])
                + sequences.to_bytes(8, "little") + len(documents).to_bytes(8, "little"))
        f.write(lengths.tobytes() + pointers.tobytes() + documents.tobytes())


def megatron_row(bin_path: pathlib.Path, chunk: int, row: int, dtype=np.uint16) -> list[int]:
    """The tokens a key's (chunk, row) names: the reader's chunk bounds say which sequence; its tokens
    are cut from the raw ``.bin`` by the lengths ``write_megatron`` wrote."""
    from flight_overlord.formats.megatron import MegatronIndexed
    index = int(MegatronIndexed(str(bin_path)).bounds[chunk]) + row
    head = open(str(bin_path)[:-4] + ".idx", "rb").read()
    count = int.from_bytes(head[18:26], "little")
    lengths = np.frombuffer(head, dtype=np.int32, count=count, offset=34).astype(np.int64)
    start = int(lengths[:index].sum())
    return np.fromfile(bin_path, dtype=dtype)[start:start + int(lengths[index])].tolist()


def write_webdataset(path: pathlib.Path, samples: list[dict[str, bytes]]) -> None:
    """A WebDataset shard: per sample, ``KEY.EXT`` members back to back
    (``samples``: ``{"__key__": ..., ext: bytes}``)."""
    import io
    import tarfile
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz" if path.name.endswith(".gz") else "w") as tar:
        for sample in samples:
            for extension, data in sample.items():
                if extension == "__key__":
                    continue
                info = tarfile.TarInfo(f"{sample['__key__']}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
