"""Parquet files: a chunk is a row group."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from .base import ChunkFile


class ParquetChunks(ChunkFile):
    def __init__(self, opened: pq.ParquetFile):
        self.file = opened
        self.metadata = opened.metadata
        self.schema = opened.schema_arrow

    @property
    def num_chunks(self) -> int:
        return self.metadata.num_row_groups

    def chunk_rows(self, chunk: int) -> int:
        return self.metadata.row_group(chunk).num_rows

    def chunk_bytes(self, chunk: int, columns: list[str] | None = None) -> int:
        meta = self.metadata.row_group(chunk)
        if columns is None:
            return meta.total_byte_size
        return sum(meta.column(i).total_uncompressed_size for i in range(meta.num_columns)
                   if meta.column(i).path_in_schema.split(".")[0] in columns)

    def read(self, chunk: int, columns: list[str]) -> pa.Table:
        return self.file.read_row_group(chunk, columns=columns)

    @property
    def index_bytes(self) -> int:
        return self.metadata.serialized_size

    def close(self) -> None:
        self.file.close()
