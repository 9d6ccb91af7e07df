"""Shuffle quality and memory of a source's read order: our shuffle window (sources[].shuffle_window,
K row groups interleaved) against MosaicML Streaming's shuffle algorithms on the same corpus.

The corpus is a source of S row groups of R rows (a Streaming shard = one row group). For one epoch
of each order it prints, side by side:

- ``resident``: the most row groups that are open at once (first sample drawn, last not yet): what a
  loader must hold in memory (in row groups; x the row group's bytes). Measured on the order itself.
- ``distinct/512``: distinct row groups among 512 consecutive samples (a full shuffle: ~min(512, S)).
- ``jump``: mean distance in the file order between consecutive samples, over N (a full shuffle: 1/3).
- ``|rho|``: Spearman rank correlation of the order with the file order (a full shuffle: ~0).

Streaming runs with one canonical node (one stream, like one source of ours) and a shuffle block of
K x R samples: the same samples in memory as our window of K. Its default block (262,144) is shown too.

    python -m benchmarks.loaders.shuffle [--row-groups 128] [--rows 8192] [--windows 1,2,4,8,16]

Needs the ``peers`` extra (``pip install -e '.[peers]'``: mosaicml-streaming).
"""
from __future__ import annotations

import importlib.util
import sys
import time
import types

import numpy as np

from benchmarks.common import benchlib
from flight_overlord.core.order import RowGroupRef
from flight_overlord.planner.feed import SourceFeed

SEED = 17
LOCAL = 512


def our_order(row_groups: int, rows: int, window: int) -> np.ndarray:
    """One epoch of the Planner's feed (the real SourceFeed, bulk draw), as file-order indices."""
    catalog = [RowGroupRef(f"part-{i:04d}.parquet", 0, rows) for i in range(row_groups)]
    lengths = {"num_tokens": np.ones(rows, dtype=np.int64)}
    feed = SourceFeed("src", catalog, SEED, lambda epoch, rg: lengths, window)
    stream = feed.stream()
    stream.take(row_groups * rows)
    index = {rg.file: i for i, rg in enumerate(sorted(catalog))}
    return np.array([index[p.ref.file] * rows + p.ref.row for p in stream.picks()], dtype=np.int64)


def streaming_shuffle():
    """``streaming.base.shuffle.get_shuffle`` without running the package's ``__init__`` (it imports
    its vision datasets, hence torchvision, which the CPU torch pin may not match)."""
    for name in ("streaming", "streaming.base"):
        spec = importlib.util.find_spec(name)
        if spec is None:
            raise SystemExit("mosaicml-streaming is not installed: pip install -e '.[peers]'")
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = list(spec.submodule_search_locations)
            sys.modules[name] = module
    from streaming.base.shuffle import get_shuffle
    return get_shuffle


def quality(order: np.ndarray, rows: int, row_groups: int) -> dict:
    n = len(order)
    assert np.array_equal(np.sort(order), np.arange(n)), "not a permutation of the epoch"
    group = order // rows
    position = np.arange(n)
    first = np.full(row_groups, n)
    last = np.full(row_groups, -1)
    np.minimum.at(first, group, position)
    np.maximum.at(last, group, position)
    events = np.zeros(n + 1, dtype=np.int64)
    np.add.at(events, first, 1)
    np.add.at(events, last + 1, -1)
    resident = int(np.cumsum(events).max())
    blocks = np.sort(group[: n // LOCAL * LOCAL].reshape(-1, LOCAL), axis=1)
    distinct = float(((np.diff(blocks, axis=1) != 0).sum(axis=1) + 1).mean())
    jump = float(np.abs(np.diff(order)).mean() / n)
    ranks = np.empty(n)
    ranks[order] = position  # the rank of each file-order index in the stream
    rho = float(np.corrcoef(ranks, np.arange(n))[0, 1])
    return {"resident": resident, "distinct": distinct, "jump": jump, "rho": abs(rho)}


def main() -> None:
    parser = benchlib.argument_parser(__doc__)
    parser.add_argument("--row-groups", type=int, default=128)
    parser.add_argument("--rows", type=int, default=8192, help="rows per row group (= per Streaming shard)")
    parser.add_argument("--windows", default="1,2,4,8,16")
    args = parser.parse_args()
    benchlib.print_header()
    get_shuffle = streaming_shuffle()
    from importlib.metadata import version
    s, r = args.row_groups, args.rows
    print(f"corpus: one source, {s} row groups x {r:,} rows = {s * r:,} samples; mosaicml-streaming "
          f"{version('mosaicml-streaming')}, 1 canonical node, seed {SEED}")
    print(f"{'order':<34}{'resident':>9}{'distinct/' + str(LOCAL):>14}{'jump':>8}{'|rho|':>8}{'seconds':>9}")
    rows_out = []

    def report(name: str, make) -> None:
        start = time.perf_counter()
        order = make()
        q = quality(order, r, s)
        rows_out.append((name, q))
        print(f"{name:<34}{q['resident']:>9}{q['distinct']:>14.1f}{q['jump']:>8.3f}{q['rho']:>8.3f}"
              f"{time.perf_counter() - start:>9.1f}", flush=True)

    rng = np.random.default_rng(SEED)
    report("full shuffle (reference)", lambda: rng.permutation(s * r))
    sizes = np.full(s, r, dtype=np.int64)
    for k in (int(x) for x in args.windows.split(",")):
        report(f"overlord shuffle_window={k}", lambda: our_order(s, r, k))
        for algo in ("py1s", "py1br", "py1e"):
            report(f"streaming {algo} block={k * r:,}", lambda: get_shuffle(algo, sizes, 1, SEED, 0, k * r))
    for algo in ("py1s", "py1br", "py1e", "py2s"):
        report(f"streaming {algo} block=262,144 (default)", lambda: get_shuffle(algo, sizes, 1, SEED, 0))


if __name__ == "__main__":
    main()
