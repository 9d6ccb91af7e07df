"""What ``overlord up`` checks of the data before any role starts, in seconds whatever the corpus size:
each source's columns and their types in one file's schema (a Parquet or IPC footer, an IPC stream's
first message: no data is read), and that its transform can be made. Every error is one line naming
the source, the file and the column (or the transform). The loaders still check every file's schema
as they catalog it; this makes the common mistakes (a wrong column name, text where token ids were
meant, an unknown transform, a strategy naming an unknown balancer or cost model) an error of the command,
not of a role process 30 s later."""
from __future__ import annotations

from .. import formats, source_files
from ..config import Config, ConfigError, SourceConfig
from ..core.registry import UnknownName
from ..loader.columns import check_columns
from ..transforms import make_transform


def check_data(cfg: Config) -> None:
    for source in cfg.sources:
        check_source(source)
    from ..planner.strategy import load_strategy
    load_strategy(cfg, cfg.mesh)  # the names a strategy file asks for (balancers, cost models) exist


def check_source(source: SourceConfig) -> None:
    path = source.files[0]
    try:
        schema = formats.read_schema(path, source.format)
    except source_files.StorageError as exc:
        raise ConfigError(f"source {source.name!r}: {exc}") from None
    check_columns(source, source_files.display(path), schema)
    if source.transform is not None:
        try:
            make_transform(source.transform.name, source.transform.options)
        except (UnknownName, ValueError) as exc:
            raise ConfigError(f"source {source.name!r}: {exc}") from None
