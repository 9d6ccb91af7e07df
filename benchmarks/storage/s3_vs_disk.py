"""Sources on S3 vs local disk: row-group read time, and what trainers wait for with and without read-ahead.

The same demo text sources are read from three places, in the same run:

- ``disk``       local Parquet files;
- ``s3``         a local S3 server (moto's server mode on 127.0.0.1) through ``s3://`` URIs;
- ``s3+LAT``     the same server behind a loopback proxy that holds every request ``--latency-ms``
                 before forwarding it: the first-byte latency of a real object store (moto on
                 loopback answers in about a millisecond, S3 in tens).

1. Row-group reads: every row group of the sources read once, cold (``source_files.parquet_file``, as
   a loader opens files, then ``read_row_group`` of the text column): median and p90 per row group.
2. Delivery: a ``LocalCluster`` per place and per read-ahead side: ``none`` (``loader:
   {read_ahead_row_groups: 1, read_ahead_bytes: 1}``: a row group is read when the Planner asks for
   it) and ``--read-ahead`` row groups; one ``StepFetcher`` per rank in lock-step, each step followed
   by ``--step-ms`` of simulated trainer compute (the Planner's ``--prefetch``, 2 as in the demo).
   Reported: the trainers' wait for data per step (median, p90) and samples per second over the
   timed steps, each the median over ``--repeats`` runs (the sides interleave).

    .venv/bin/python -m benchmarks.storage.s3_vs_disk  # defaults: ~5 min on 2 loaded cores
    .venv/bin/python -m benchmarks.storage.s3_vs_disk --latency-ms 50 --steps 60 --plot docs/storage.png
"""
from __future__ import annotations

import glob
import os
import statistics
import time
from pathlib import Path

from benchmarks.common import benchlib
from benchmarks.common.benchlib import log
from benchmarks.common.s3 import LatencyProxy, moto_s3
from flight_overlord import source_files
from flight_overlord.client import StepFetcher
from flight_overlord.config import load_config
from flight_overlord.deploy.launch import LocalCluster

SOURCES = [("captions", 0.15), ("longdocs", 0.25), ("code", 0.20), ("docstrings", 0.15), ("manuals", 0.15),
           ("qa", 0.10)]
BUCKET = "bench"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_EC2_METADATA_DISABLED": "true"}


def paths_of(place: str, port: int | None, data_dir: Path, name: str) -> str:
    if place == "disk":
        return str(data_dir / name / "*.parquet")
    return f"s3://{BUCKET}/{name}/*.parquet?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"


def row_group_reads(pattern: str) -> list[float]:
    """Seconds per row group, every row group of the files ``pattern`` names, each file opened cold."""
    files = source_files.expand(pattern) if source_files.is_uri(pattern) else sorted(glob.glob(pattern))
    times = []
    for path in files:
        opened = source_files.parquet_file(path, pre_buffer=False)
        for g in range(opened.metadata.num_row_groups):
            start = time.perf_counter()
            opened.read_row_group(g, columns=["text"])
            times.append(time.perf_counter() - start)
        opened.close()
    return times


def deliver(config: Path, steps: int, warmup: int, step_ms: float) -> dict:
    """Lock-step trainers over a cluster of ``config``: wait for data per step, samples per second."""
    ranks = load_config(config).mesh.world_size
    with LocalCluster(config) as cluster:
        fetchers = [StepFetcher(cluster.planner, r, timeout=120) for r in range(ranks)]
        waits, samples = [], 0
        for step in range(warmup + steps):
            if step == warmup:
                timed_from = time.perf_counter()
            start = time.perf_counter()
            tables = [f.fetch(step) for f in fetchers]
            if step >= warmup:
                waits.append(time.perf_counter() - start)
                samples += sum(len(k) for t in tables for k in t.column("sample_keys").to_pylist())
            time.sleep(step_ms / 1000)
        wall = time.perf_counter() - timed_from
        for f in fetchers:
            f.close()
    waits.sort()
    return {"wait_median": statistics.median(waits), "wait_p90": waits[int(0.9 * (len(waits) - 1))],
            "samples_per_s": samples / wall}


def main() -> None:
    p = benchlib.argument_parser(__doc__)
    benchlib.add_corpus_args(p, scale=0.3)
    p.add_argument("--latency-ms", type=float, default=20.0, help="held per request by the proxy (default 20)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--step-ms", type=float, default=30.0, help="simulated trainer compute per step (default 30)")
    p.add_argument("--read-ahead", type=int, default=4, help="read_ahead_row_groups of the read-ahead side "
                   "(the other side: none)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each delivery configuration (default 2)")
    p.add_argument("--prefetch", type=int, default=2, help="the Planner's prefetch, steps planned ahead of the "
                   "trainers (default 2, as in the demo)")
    p.add_argument("--tokens-per-step", type=int, default=16000)
    p.add_argument("--plot", type=Path, help="write a plot here (needs matplotlib: the bench extra)")
    args = p.parse_args()
    benchlib.print_header()
    names = [n for n, _ in SOURCES]
    os.environ.update(CREDENTIALS)  # the roles are child processes: they inherit them
    with (benchlib.workspace("bench-storage-", args.data, names, args.scale) as (tmp, data_dir),
          moto_s3(data_dir, names, BUCKET, access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"]) as (_, port, _)):
        proxy = LatencyProxy(port, args.latency_ms / 1000)
        lat = f"s3+{args.latency_ms:g}ms"
        places = [("disk", None), ("s3", port), (lat, proxy.port)]
        try:
            print(f"\ncorpus: {len(names)} text sources at scale {args.scale}; latency proxy: {args.latency_ms:g} ms "
                  f"per request\n\n1. row-group reads (text column, cold file handles), ms per row group")
            print(f"{'place':<14} {'row groups':>10} {'median':>8} {'p90':>8} {'total s':>8}")
            reads = {}
            for place, where in places:
                times = sorted(t for n in names for t in row_group_reads(paths_of(place, where, data_dir, n)))
                reads[place] = times
                print(f"{place:<14} {len(times):>10} {1e3 * statistics.median(times):>8.2f} "
                      f"{1e3 * times[int(0.9 * (len(times) - 1))]:>8.2f} {sum(times):>8.2f}")
            print(f"\n2. delivery: 2 ranks, {args.steps} timed steps after {args.warmup}, {args.step_ms:g} ms of "
                  f"trainer compute per step, tokens_per_step {args.tokens_per_step}, prefetch {args.prefetch}, "
                  f"median of {args.repeats} runs")
            print(f"{'place':<14} {'read-ahead':>12} {'wait median ms':>15} {'wait p90 ms':>12} {'samples/s':>10}")
            sides = {"none": {"read_ahead_row_groups": 1, "read_ahead_bytes": 1},
                     f"{args.read_ahead} groups": {"read_ahead_row_groups": args.read_ahead}}
            runs: dict = {}
            for repeat in range(args.repeats):
                for place, where in places:
                    for side, loader in sides.items():
                        run = tmp / f"run-{place}-{side.replace(' ', '_')}-{repeat}"
                        run.mkdir()
                        sources = [{"name": n, "weight": w, "paths": paths_of(place, where, data_dir, n)}
                                   for n, w in SOURCES]
                        config = benchlib.write_config(
                            run / "config.yaml", data_dir, sources,
                            ranks=2, context_length=4096, microbatches=2, tokens_per_step=args.tokens_per_step, seed=0,
                            run_dir=run / "run", loader=loader, prefetch=args.prefetch)
                        log(f"delivery: {place}, read-ahead {side}, run {repeat + 1}/{args.repeats}")
                        delivered = deliver(config, args.steps, args.warmup, args.step_ms)
                        runs.setdefault((place, side), []).append(delivered)
            delivery = {key: {k: statistics.median(r[k] for r in results) for k in results[0]}
                        for key, results in runs.items()}
            for (place, side), result in delivery.items():
                print(f"{place:<14} {side:>12} {1e3 * result['wait_median']:>15.1f} "
                      f"{1e3 * result['wait_p90']:>12.1f} {result['samples_per_s']:>10.0f}")
            print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            if args.plot:
                plot(args.plot, reads, delivery, [p for p, _ in places], list(sides))
        finally:
            proxy.close()


def plot(path: Path, reads: dict, delivery: dict, places: list[str], sides: list[str]) -> None:
    plt = benchlib.pyplot(path)
    if plt is None:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.bar(places, [1e3 * statistics.median(reads[p]) for p in places], color="tab:blue")
    left.set_ylabel("ms per row group (median)")
    left.set_title("row-group read, cold")
    x = range(len(places))
    for offset, side, color in zip((-0.2, 0.2), sides, ("tab:red", "tab:green")):
        right.bar([i + offset for i in x], [1e3 * delivery[(p, side)]["wait_p90"] for p in places], width=0.4,
                  color=color, label=f"read-ahead: {side}")
    right.set_xticks(list(x), places)
    right.set_ylabel("trainer wait per step, p90 (ms)")
    right.set_title("delivery: wait for data")
    right.legend(fontsize=8)
    benchlib.save_plot(fig, path)


if __name__ == "__main__":
    main()
