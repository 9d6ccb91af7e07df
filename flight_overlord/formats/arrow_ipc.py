"""Arrow IPC files: a chunk is a record batch.

Two layouts share the ``.arrow`` name: the IPC *file* format (``ARROW1`` magic, a footer indexing its
record batches; also Feather v2) and the IPC *stream* format (no footer: messages back to back), the
one Hugging Face ``datasets`` writes. A stream file is indexed by one scan of its message headers
(each batch's offset, length and rows; over a memory map no batch body is copied), after which a
batch is read at its offset like a file's.
"""
from __future__ import annotations

import threading

import pyarrow as pa

from .base import ChunkFile

IPC_FILE_MAGIC = b"ARROW1"


def is_ipc_file(handle: pa.NativeFile) -> bool:
    """The file starts with the IPC file format's magic (else it is taken for a stream)."""
    return bytes(handle.read_at(len(IPC_FILE_MAGIC), 0)) == IPC_FILE_MAGIC


def _slicer(handle: pa.NativeFile):
    """``(offset, length) -> buffer``, safe across threads: a view of a memory map (no copy), else a read_at."""
    if isinstance(handle, pa.MemoryMappedFile):
        handle.seek(0)
        whole = handle.read_buffer()
        return lambda offset, length: whole.slice(offset, length)
    return lambda offset, length: pa.py_buffer(handle.read_at(length, offset))


def _selected(batch: pa.RecordBatch, columns: list[str]) -> pa.Table:
    return pa.Table.from_batches([batch]).select(columns)


class _RecordBatchChunks(ChunkFile):
    """A file whose chunks are its record batches: a subclass says where batch ``chunk`` is (``_batch``)."""
    handle: pa.NativeFile

    def _batch(self, chunk: int) -> pa.RecordBatch:
        raise NotImplementedError

    def chunk_bytes(self, chunk: int, columns: list[str] | None = None) -> int:
        batch = self._batch(chunk)
        return (batch if columns is None else _selected(batch, columns)).nbytes

    def read(self, chunk: int, columns: list[str]) -> pa.Table:
        return _selected(self._batch(chunk), columns)

    def close(self) -> None:
        self.handle.close()


class ArrowIpcFile(_RecordBatchChunks):
    def __init__(self, handle: pa.NativeFile):
        self.handle = handle
        self.reader = pa.ipc.open_file(handle)
        self.schema = self.reader.schema
        self._lock = threading.Lock()  # one reader, several reading threads
        self._rows = [self._batch(i).num_rows for i in range(self.reader.num_record_batches)]

    def _batch(self, chunk: int) -> pa.RecordBatch:
        with self._lock:
            return self.reader.get_batch(chunk)

    @property
    def num_chunks(self) -> int:
        return len(self._rows)

    def chunk_rows(self, chunk: int) -> int:
        return self._rows[chunk]


class ArrowStreamFile(_RecordBatchChunks):
    def __init__(self, handle: pa.NativeFile):
        self.handle = handle
        self.schema, self._batches = self._scan(handle)
        self._slice = _slicer(handle)

    @property
    def index_bytes(self) -> int:
        return 24 * len(self._batches)

    @staticmethod
    def _scan(handle: pa.NativeFile) -> tuple[pa.Schema, list[tuple[int, int, int]]]:
        """The stream's schema and (offset, length, rows) of each record batch message."""
        handle.seek(0)
        reader = pa.ipc.MessageReader.open_stream(handle)
        schema, batches = None, []
        while True:
            offset = handle.tell()
            try:
                message = reader.read_next_message()
            except StopIteration:
                break
            if message.type == "schema":
                schema = pa.ipc.read_schema(message)
            elif message.type == "dictionary batch":
                raise ValueError("dictionary-encoded columns in an IPC stream are not supported "
                                 "(convert the file with `overlord convert` or write it without dictionaries)")
            elif message.type == "record batch":
                if schema is None:
                    raise ValueError("a record batch before the schema: not an Arrow IPC stream")
                batches.append((offset, handle.tell() - offset, pa.ipc.read_record_batch(message, schema).num_rows))
        if schema is None:
            raise ValueError("no schema message: not an Arrow IPC stream")
        return schema, batches

    @property
    def num_chunks(self) -> int:
        return len(self._batches)

    def chunk_rows(self, chunk: int) -> int:
        return self._batches[chunk][2]

    def _batch(self, chunk: int) -> pa.RecordBatch:
        offset, length, _ = self._batches[chunk]
        message = pa.ipc.read_message(self._slice(offset, length))
        return pa.ipc.read_record_batch(message, self.schema)
