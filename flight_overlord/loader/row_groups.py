"""One loader actor's share of a source: its row groups, their file handles, reading and transforming."""
from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import formats
from ..config import ConfigError, SourceConfig, VisionConfig
from ..core.order import RowGroupRef, owned_row_groups, sample_key
from ..core.vision import ImageError
from ..source_catalog import SourceCatalog, ValidatedCatalogs, load_catalog
from ..transforms import make_transform
from ..transforms.image_text import transform_rows
from ..transforms.pretokenized import loss_masks, token_lists
from ..wire.schemas import list_array
from .columns import check_columns

log = logging.getLogger(__name__)
# Parquet files an actor keeps open (the most recently read): an open file holds its footer and reader
# state, ~24 KiB for a small demo file and more for a wide one, so keeping every file open grows a loader
# host's memory until the last file has come up (docs/methods/memory-peers.md). A row group is read in
# one call, so reopening a file that fell out costs one footer read per row group.
OPEN_FILES_KEPT = 2


def read_catalog(source: SourceConfig) -> list[RowGroupRef]:
    """Every row group of the source, sorted; checks its columns (``checked_catalog``)."""
    return checked_catalog(source).row_groups()


def checked_catalog(source: SourceConfig, validated: ValidatedCatalogs | None = None) -> SourceCatalog:
    """The source's catalog (cached once per corpus: ``source_catalog``; ``validated``: see ``load_catalog``),
    its columns checked in each schema its files have."""
    catalog = load_catalog(source, validated)
    for path, schema in catalog.schemas_by_file():
        check_columns(source, path, schema)
    return catalog


def compact_tokens(tokens: pa.ListArray) -> pa.ListArray:
    """The token ids in the narrowest unsigned type that holds them (uint8 for the byte tokenizer,
    uint16 for vocabularies under 65,536): a buffered row group is 2-4x smaller than as int32; a
    served sample is widened back to the wire's int32 (``samples_table``). Anything else as is."""
    values = tokens.flatten().to_numpy(zero_copy_only=False)
    if tokens.null_count or not values.size or values.min() < 0 or values.max() >= 65536:
        return tokens
    narrow = pa.uint8() if values.max() < 256 else pa.uint16()
    offsets = tokens.offsets.to_numpy()
    return pa.ListArray.from_arrays(pa.array(offsets - offsets[0], pa.int32()),
                                    pa.array(values.astype(narrow.to_pandas_dtype())))


class SampleKeys:
    """The sample keys of a row group's rows, made when asked: kept as a list of strings they cost
    ~90 bytes a row, more than a short row's tokens (a 2 MiB row group of short texts: 50k rows)."""

    def __init__(self, source: str, rg: RowGroupRef):
        self.prefix = sample_key(source, rg.file, rg.row_group, 0)[:-1]  # "source:file:row_group:"
        self.rows = rg.num_rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, row: int) -> str:
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} of a row group of {self.rows}")
        return f"{self.prefix}{row}"

    def array(self, rows: pa.Array | None = None) -> pa.StringArray:
        """The keys of ``rows`` (default: every row), as Arrow strings."""
        rows = pa.array(np.arange(self.rows, dtype=np.int32)) if rows is None else rows
        return pc.binary_join_element_wise(self.prefix, rows.cast(pa.string()), "")


@dataclass
class RowGroupSamples:
    """A read, transformed row group held in the loader's buffer until every row is popped.

    Sample-level (``loader.sample_level_bytes``, text sources): ``tokens`` is None and the buffer
    holds only each row's token count (``lengths``); ``reread`` reads the rows a request names again
    from the file (the transform is per row, so they are the same tokens)."""
    tokens: pa.ListArray | None  # in the file's row order (text: ``compact_tokens``, any unsigned/int32 width)
    keys: SampleKeys
    remaining: np.ndarray  # bool per row: not yet popped
    failed: bool = False  # unreadable: metadata reports num_tokens = -1 so the Planner skips its rows
    images: pa.ListArray | None = None  # image-text sources: list<binary> per row (encoded, or decoded patches)
    grids: pa.ListArray | None = None   # list<int32> per row: flattened (t, h, w) per image
    patches: np.ndarray | None = None   # vision-encoder patches per row
    bad: np.ndarray | None = None       # bool per row: a bad image; reported as num_tokens -1, never served
    lengths: np.ndarray | None = None   # sample-level: tokens per row (int32), the token ids dropped
    reread: Callable[[pa.Array], pa.ListArray] | None = None  # sample-level: row indices -> their tokens
    loss_mask: pa.ListArray | None = None  # pre-tokenized with loss_mask_column: uint8 0/1 per token

    @classmethod
    def failed_read(cls, source: str, rg: RowGroupRef) -> "RowGroupSamples":
        empty = pa.ListArray.from_arrays(pa.array(np.zeros(rg.num_rows + 1, np.int32)), pa.array([], pa.int32()))
        return cls(empty, SampleKeys(source, rg), np.zeros(rg.num_rows, dtype=bool), failed=True)

    def sample_level(self, reread: Callable[[pa.Array], pa.ListArray]) -> "RowGroupSamples":
        """This row group holding only its rows' token counts; ``reread(indices)`` gives their tokens."""
        return dataclasses.replace(self, tokens=None, lengths=self.row_lengths(), reread=reread)

    def row_lengths(self) -> np.ndarray:
        """Tokens per row (a new int32 array)."""
        if self.tokens is None:
            return self.lengths.copy()
        return np.diff(self.tokens.offsets.to_numpy()).astype(np.int32)

    def tokens_of(self, indices: pa.Array) -> pa.ListArray:
        """The token lists of rows ``indices`` (int32 array), from the buffer or, sample-level, the file."""
        return self.tokens.take(indices) if self.tokens is not None else self.reread(indices)

    @property
    def nbytes(self) -> int:
        held = self.tokens.nbytes if self.tokens is not None else self.lengths.nbytes
        return held + sum(extra.nbytes for extra in (self.images, self.loss_mask) if extra is not None)

    def _image_sizes(self, rows: int) -> pa.ListArray:
        """Patches per image per row: the product of each (t, h, w) triple of the grids."""
        if self.grids is None:
            return pa.ListArray.from_arrays(pa.array(np.zeros(rows + 1, np.int32)), pa.array([], pa.int32()))
        triples = self.grids.values.to_numpy().reshape(-1, 3)
        return pa.ListArray.from_arrays(pa.array(self.grids.offsets.to_numpy() // 3),
                                        pa.array(triples.prod(axis=1).astype(np.int32)))

    def metadata(self) -> pa.RecordBatch:
        lengths = self.row_lengths()
        nbytes = lengths.astype(np.int64) * 4
        if self.images is not None:  # image bytes per row, without copying them out of Arrow
            lengths_of_images = pc.fill_null(pc.binary_length(self.images.values), 0).to_numpy()
            cumulative = np.concatenate([[0], np.cumsum(lengths_of_images, dtype=np.int64)])
            nbytes += np.diff(cumulative[self.images.offsets.to_numpy()])
        if self.failed:
            lengths[:] = -1
        if self.bad is not None:
            lengths[self.bad] = -1
        patches = self.patches if self.patches is not None else np.zeros(len(lengths))
        return pa.record_batch({
            "key": self.keys.array(),
            "row": pa.array(np.arange(len(self.keys), dtype=np.int32)),
            "num_tokens": pa.array(lengths),
            "image_patches": pa.array(patches.astype(np.int32)),
            "image_sizes": self._image_sizes(len(lengths)),
            "num_bytes": pa.array(nbytes),
        })


class SourceShare:
    """The row groups actor ``actor`` of ``source.loaders`` owns; files are opened only here.
    ``provisioned``: actors of the source in all, idle ones included (``loader.scaling``); an actor
    past ``source.loaders`` owns nothing until the Planner reshards onto it (``catalog`` is the
    whole source's, for that). ``validated``: the catalogs the start that launched this process validated."""

    def __init__(self, source: SourceConfig, actor: int, max_tokens: int, vision: VisionConfig = VisionConfig(),
                 provisioned: int = 0, validated: ValidatedCatalogs | None = None):
        if not 0 <= actor < max(source.loaders, provisioned):
            raise ConfigError(f"source {source.name!r}: actor {actor} out of range (loaders: {source.loaders}"
                              + (f", provisioned: {provisioned})" if provisioned > source.loaders else ")"))
        self.source = source
        self.actor = actor
        self.max_tokens = max_tokens
        self.vision = vision
        catalog = checked_catalog(source, validated)
        self.catalog = catalog.row_groups()
        self.catalog_digest = catalog.digest()  # what it registers with: the Planner finds the catalog by it
        self.row_groups = owned_row_groups(self.catalog, actor, source.loaders) if actor < source.loaders else []
        self._paths = dict(zip(source.file_ids, source.files))
        self._open: collections.OrderedDict[str, formats.ChunkFile] = collections.OrderedDict()  # most recent last
        self._open_lock = threading.Lock()  # the read-ahead thread and request threads read at once
        if source.tokens_column:  # pre-tokenized: the column holds the token ids
            self._tokenize = functools.partial(token_lists, name=source.tokens_column)
            self._column = source.tokens_column
        else:
            self._tokenize = make_transform(source.transform.name, source.transform.options)
            self._column = source.text_column

    def read(self, rg: RowGroupRef) -> RowGroupSamples:
        keys = SampleKeys(self.source.name, rg)
        if self.source.image_column:
            return self._read_image_text(rg, keys)
        mask_column = self.source.loss_mask_column
        table = self._file(rg.file).read(rg.row_group, [self._column, *([mask_column] if mask_column else [])])
        column = table.column(0).combine_chunks()
        tokens = compact_tokens(self._tokenize(column, self.max_tokens))
        mask = loss_masks(table.column(1), column, self.max_tokens, mask_column) if mask_column else None
        return RowGroupSamples(tokens, keys, np.ones(rg.num_rows, dtype=bool), loss_mask=mask)

    def read_rows(self, rg: RowGroupRef, indices: pa.Array) -> pa.ListArray:
        """The tokens of rows ``indices`` of a text (or pre-tokenized) row group, as ``read`` makes them
        (the transform is per row): its column read again, only those rows transformed (the sample-level path)."""
        table = self._file(rg.file).read(rg.row_group, [self._column])
        return self._tokenize(table.column(0).take(indices).combine_chunks(), self.max_tokens)

    def _read_image_text(self, rg: RowGroupRef, keys: SampleKeys) -> RowGroupSamples:
        """Sample transform of an image-text row group: tokens with image placeholder runs, patch
        counts from the image headers; pixels decoded here only with ``vision.decode_at: loader``."""
        columns = [self.source.text_column, self.source.image_column]
        table = self._file(rg.file).read(rg.row_group, columns)
        texts, images = (table.column(c).combine_chunks() for c in columns)
        rows = transform_rows(texts, images, self._tokenize, self.vision, self.max_tokens,
                              decode=self.vision.decode_at == "loader")
        bad = np.zeros(rg.num_rows, dtype=bool)
        for row, error in sorted(rows.errors.items()):
            message = f"sample {keys[row]}: {error}"
            if self.vision.on_bad_image == "fail":
                raise ImageError(message)
            log.error("%s; skipped (vision.on_bad_image: skip)", message)
            bad[row] = True
        return RowGroupSamples(
            tokens=list_array(rows.tokens), keys=keys, remaining=~bad,
            images=pa.array(rows.images, pa.list_(pa.binary())), grids=pa.array(rows.grids, pa.list_(pa.int32())),
            patches=rows.patches, bad=bad)

    def _file(self, file_id: str) -> formats.ChunkFile:
        # The newest OPEN_FILES_KEPT files stay open: the footer stays in this process only. One that falls
        # out is not closed here (another thread may be reading through it): it closes with its last reference.
        with self._open_lock:
            opened = self._open.get(file_id)
            if opened is not None:
                self._open.move_to_end(file_id)
                return opened
        opened = formats.open_chunks(self._paths[file_id], self.source.format, pre_buffer=False,
                                     page_checksum_verification=True)  # Parquet: where the file has CRCs
        with self._open_lock:
            self._open[file_id] = opened
            while len(self._open) > OPEN_FILES_KEPT:
                self._open.popitem(last=False)
        return opened

    def close(self) -> None:
        with self._open_lock:
            opened, self._open = list(self._open.values()), collections.OrderedDict()
        for f in opened:
            f.close()
