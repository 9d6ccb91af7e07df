"""``ChunkFile``: what the loader, the checks before start-up and the fingerprints need of one file."""
from __future__ import annotations

import pyarrow as pa


class ChunkFile:
    """One open file as a catalog of chunks. Subclasses set ``schema`` and implement the rest;
    ``read`` may be called from several threads at once."""
    schema: pa.Schema

    @property
    def num_chunks(self) -> int:
        raise NotImplementedError

    def chunk_rows(self, chunk: int) -> int:
        raise NotImplementedError

    def chunk_bytes(self, chunk: int, columns: list[str] | None = None) -> int:
        """The chunk's data bytes (of ``columns`` only, when named): what profiles and fingerprints weigh."""
        raise NotImplementedError

    def read(self, chunk: int, columns: list[str]) -> pa.Table:
        raise NotImplementedError

    @property
    def index_bytes(self) -> int:
        """What the open file's index (a Parquet footer) holds in memory, about."""
        return 0

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> "ChunkFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
