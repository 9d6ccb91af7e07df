#!/usr/bin/env python
"""Where a Planner finds the catalog a loader registers with, and what each place costs (``planner/catalogs.py``).

The corpus of ``file_count`` (4 text sources, ``--files`` files in all, 1 row group each) is served by one
real loader host (``LoaderServer`` on loopback, one actor per source, its own catalog cache: it builds the
catalogs, as a loader host's first start does). A Planner's ``CatalogCache`` on a config whose
``data_root`` does not exist, with an empty cache of its own, then gets each source's catalog three
ways, timed per corpus (seconds for the 4 sources, one after the other, in this process):

- ``loader``: its cache lacks it: the registering loader's ``catalog`` ticket over Flight (the loader host
  in a process of its own, on loopback), the digest derived again, the catalog written into the Planner's
  cache (what a Planner without the data does);
- ``cache``: a new ``CatalogCache`` on that host, as a resumed or standby Planner has: by digest;
- ``files``: a Planner that sees the data but not the loaders' cache (before this change, the only way
  when the cache was not shared): a ``stat`` per file and every footer read (the page cache is warm: the
  loader host read the same footers just before, so on storage of its own this is a lower bound).

``MiB sent``: the Arrow bytes of the 4 catalogs as the loader streams them.

    .venv/bin/python -m benchmarks.startup.catalog_fetch --files 1000,10000,100000
"""
from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from pathlib import Path

from benchmarks.common.benchlib import MiB, argument_parser
from benchmarks.startup.file_count import SOURCES, make_corpus, write_config


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--files", default="1000,10000", help="files in all per corpus, comma-separated")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "overlord-catalog-fetch")
    args = parser.parse_args()
    os.environ.setdefault("OVERLORD_CLUSTER_SECRET", "catalog-fetch-benchmark-secret-0123")
    print(f"{'files':>8} {'loader s':>9} {'cache s':>8} {'files s':>8} {'MiB sent':>9}")
    for files in (int(f) for f in args.files.split(",")):
        r = measure(args.workdir, files)
        print(f"{files:>8} {r['loader']:>9.2f} {r['cache']:>8.2f} {r['files']:>8.2f} {r['sent'] / MiB:>9.1f}",
              flush=True)


def measure(work: Path, files: int) -> dict:
    from flight_overlord.config import load_config
    from flight_overlord.planner.calls import CatalogCalls
    from flight_overlord.planner.catalogs import CatalogCache
    from flight_overlord.source_catalog import CATALOG_DIR_ENV
    from flight_overlord.wire.security import Security

    data = make_corpus(work, files, 1)
    run = Path(tempfile.mkdtemp(prefix=f"run-{files}-", dir=work))
    config = write_config(run, data, lambda name: f"{name}/*.parquet")
    (run / "planner").mkdir()
    blind = write_config(run / "planner", run / "no-data", lambda name: f"{name}/*.parquet")
    answers, stop = multiprocessing.Queue(), multiprocessing.Event()
    loader_host = multiprocessing.Process(target=serve_loader_host, args=(config, run / "loader-catalogs", answers,
                                                                         stop))
    loader_host.start()
    try:
        location, digests, sent = answers.get(timeout=600)
        blind_cfg = load_config(blind, expand_files=False)
        os.environ[CATALOG_DIR_ENV] = str(run / "planner-catalogs")
        fetch = CatalogCalls(Security.from_config(blind_cfg).credentials, seconds=60)
        fetching = CatalogCache(blind_cfg, fetch)
        loader = timed(lambda: [fetching(name, digest, [location]) for name, digest in digests.items()])
        cached = CatalogCache(blind_cfg)
        cache = timed(lambda: [cached(name, digest) for name, digest in digests.items()])
        os.environ[CATALOG_DIR_ENV] = str(run / "another-host-catalogs")
        reading = CatalogCache(load_config(config, expand_files=False))
        read = timed(lambda: [reading(name, digest) for name, digest in digests.items()])
    finally:
        stop.set()
        loader_host.join(60)
    return {"loader": loader, "cache": cache, "files": read, "sent": sent}


def serve_loader_host(config: Path, catalogs: Path, answers, stop) -> None:
    """A loader host process with its own catalog cache (it builds the catalogs): one actor per source,
    served until ``stop``; answers (location, {source: digest}, bytes of the catalogs' tables)."""
    from flight_overlord.config import load_config
    from flight_overlord.loader.actor import LoaderActor
    from flight_overlord.loader.row_groups import SourceShare
    from flight_overlord.loader.server import LoaderServer
    from flight_overlord.source_catalog import CATALOG_DIR_ENV, catalog_table
    from flight_overlord.wire.security import Security

    os.environ[CATALOG_DIR_ENV] = str(catalogs)
    cfg = load_config(config)
    actors = [LoaderActor(SourceShare(cfg.source(name), 0, cfg.global_batch.context_length), seed=cfg.seed,
                          read_ahead=0, run_dir=cfg.run_dir) for name in SOURCES]
    server = LoaderServer(actors, Security.from_config(cfg))
    digests = {a.share.source.name: a.share.catalog_digest for a in actors}
    sent = sum(catalog_table(cfg.source(name), digest).nbytes for name, digest in digests.items())
    answers.put((f"grpc://127.0.0.1:{server.port}", digests, sent))
    stop.wait()
    server.shutdown()  # closes its actors


def timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
