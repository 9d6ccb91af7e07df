"""What a trainer receives per second, and what each deployment costs in memory.

Three sides, measured in the same run on the same corpus, one process per trainer rank:

1. ceiling         a bare pyarrow Flight server (its own process) streams real step tables
                   captured from side 2 with ``RecordBatchStream``; each rank's client reads
                   them over and over (``do_get(...).read_all()`` + the same to-tensor
                   conversion as TrainerClient): the transport ceiling.
2. flight_overlord ``LocalCluster`` (Planner, Source Loaders, Data Constructors) and one trainer
                   process per rank iterating ``TrainerClient``.
3. baseline        the conventional colocated loader: a torch ``DataLoader`` per rank with
                   ``num_workers`` workers; every worker opens every Parquet file of every
                   source, reads its shard of row groups, tokenizes, mixes and packs itself.

Every side runs ``--warmup`` steps first (not timed), then ``--steps`` timed steps; all ranks
start the timed phase together. Throughput is summed over ranks: bytes (Arrow ``nbytes`` of
the step tables, or the exact same count for the baseline's tensors) and batches (packed
microbatches) over the wall time of the timed phase. Memory is the PSS summed over every
process of the deployment (including children), sampled during the timed phase; the max is
reported. The driver (this process) is not counted.

    .venv/bin/python -m benchmarks.delivery.throughput              # defaults: ~20 s on 2 cores
    .venv/bin/python -m benchmarks.delivery.throughput --steps 600  # ~1.5 min: timed phases of ~20 s
    .venv/bin/python -m benchmarks.delivery.throughput --quick      # fewer steps
    .venv/bin/python -m benchmarks.delivery.throughput --workers 4 --data /tmp/demo

With the default 30 steps the timed phases are short (well under a second for the ceiling), so
compare sides within one run and prefer ``--steps 600`` for figures to publish. The machine is
shared: the report says how much CPU everything else used while each side was timed.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np

# first: in a trainer process it loads our client before pyarrow, as a training script does
from benchmarks.common.rank_processes import (
    TRAINER_SIDE,
    RankChannel,
    SideResult,
    Tally,
    microbatch_nbytes,
    run_ranks,
    stop_processes,
)

# isort: split
import pyarrow as pa
import yaml

from benchmarks.common.benchlib import (
    REPO,
    MiB,
    add_corpus_args,
    add_mesh_args,
    argument_parser,
    cluster_roots,
    log,
    plan_imbalance,
    print_header,
    workspace,
    write_config,
)
from benchmarks.common.colocated import baseline_rank

DEMO_CONFIG = REPO / "configs" / "demo.yaml"
# Used when configs/demo.yaml is missing: the demo's token-share weights and loader counts.
FALLBACK_SOURCES = [("captions", 0.15, 2), ("longdocs", 0.25, 1), ("code", 0.20, 1),
                    ("docstrings", 0.15, 1), ("manuals", 0.15, 1), ("qa", 0.10, 1)]
FALLBACK_FILL = 29000 / (2 * 4 * 4096)  # the demo's tokens_per_step over its slots
CAPTURED_PER_RANK = 4  # real step tables per rank kept for the ceiling side


# ---------------------------------------------------------------------------------------------
# Side 2: flight_overlord
# ---------------------------------------------------------------------------------------------

def overlord_trainer(channel: RankChannel, planner: str, warmup: int, steps: int, capture_dir: str | None) -> None:
    """One rank's TrainerClient; ``capture_dir``: where to write a few of its step tables for the ceiling
    side (None: keep none, as the memory benchmarks do: the tables held would count as the trainer's)."""
    from flight_overlord.client.trainer import TrainerClient, table_to_microbatches

    # as_tensors=False plus table_to_microbatches() is exactly what as_tensors=True does (in the
    # same consumer thread), but also gives the step table: its nbytes, and tables to capture.
    tally, captured = Tally(channel.rank), []
    with TrainerClient(planner, channel.rank, num_steps=warmup + steps, as_tensors=False) as client:
        tables = iter(client)
        for _ in range(warmup):
            table_to_microbatches(next(tables))
        channel.warm()
        tally.t0 = time.monotonic()
        for table in tables:
            tally.add_step(table_to_microbatches(table), table.nbytes)
            if capture_dir and len(captured) < CAPTURED_PER_RANK:
                captured.append(table)
        tally.t1 = time.monotonic()
    for i, table in enumerate(captured):  # after timing: for the ceiling side
        with pa.OSFile(str(Path(capture_dir) / f"rank{channel.rank}-{i}.arrow"), "wb") as sink:
            with pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
    channel.result(tally)


def run_overlord(args, config_path: Path, capture_dir: Path) -> SideResult:
    from flight_overlord.deploy.launch import LocalCluster

    cluster = LocalCluster(config_path)
    try:
        started = time.monotonic()
        planner = cluster.start()
        roles = cluster_roots(cluster)
        cluster_pids = [pid for pid, _, _ in roles]
        log(f"[flight_overlord] {len(roles)} role processes up in {time.monotonic() - started:.1f}s")
        tallies, sampler = run_ranks(
            TRAINER_SIDE, overlord_trainer,
            [(planner, args.warmup, args.steps, str(capture_dir)) for _ in range(args.ranks)],
            label="trainer", extra_roots=lambda: roles, timeout=args.timeout)
        imbalance = plan_imbalance(planner, args.warmup, args.warmup + args.steps - 1)
    finally:
        cluster.stop()
    result = SideResult("flight_overlord", tallies, sampler.max_pss, sampler.processes, sampler.samples,
                        args.context_length)
    result.notes.append(f"{len(cluster_pids)} role processes (1 planner, "
                        f"{len(cluster_pids) - 1 - args.ranks} loaders, {args.ranks} constructors) "
                        f"+ {args.ranks} trainers")
    result.notes.append(imbalance)
    result.notes += sampler.summary()
    return result


# ---------------------------------------------------------------------------------------------
# Side 1: the transport ceiling
# ---------------------------------------------------------------------------------------------

def ceiling_server(paths: list[str], messages) -> None:
    """A bare Flight server: ticket = a captured table's file name, answered from memory in C++."""
    import pyarrow.flight as fl

    class Server(fl.FlightServerBase):
        def __init__(self, tables: dict[bytes, pa.Table]):
            self.tables = tables  # state first: Flight may accept calls during __init__
            super().__init__("grpc://127.0.0.1:0")

        def do_get(self, context, ticket):
            return fl.RecordBatchStream(self.tables[ticket.ticket])

    tables = {Path(p).name.encode(): pa.ipc.open_file(p).read_all() for p in paths}
    server = Server(tables)
    messages.put(server.port)
    server.serve()  # returns on SIGTERM


def ceiling_client(channel: RankChannel, port: int, names: list[str], warmup: int, steps: int) -> None:
    import pyarrow.flight as fl

    from flight_overlord.client.trainer import table_to_microbatches

    client = fl.connect(f"grpc://127.0.0.1:{port}")
    tickets = [fl.Ticket(name.encode()) for name in names]
    tally = Tally(channel.rank)
    for i in range(warmup + steps):
        if i == warmup:
            channel.warm()
            tally.t0 = time.monotonic()
        table = client.do_get(tickets[i % len(tickets)]).read_all()
        microbatches = table_to_microbatches(table)
        if i >= warmup:
            tally.add_step(microbatches, table.nbytes)
    tally.t1 = time.monotonic()
    client.close()
    channel.result(tally)


def run_ceiling(args, capture_dir: Path) -> SideResult:
    paths = sorted(str(p) for p in capture_dir.glob("rank*-*.arrow"))
    if not paths:
        raise RuntimeError(f"no captured step tables in {capture_dir}")
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    server = ctx.Process(target=ceiling_server, args=(paths, messages), name="ceiling-server", daemon=True)
    server.start()
    try:
        port = messages.get(timeout=60)
        names = [[Path(p).name for p in paths if Path(p).name.startswith(f"rank{r}-")] for r in range(args.ranks)]
        tallies, sampler = run_ranks("ceiling", ceiling_client,
                                     [(port, names[r], args.warmup, args.steps) for r in range(args.ranks)],
                                     label="client", extra_roots=lambda: [(server.pid, "server", "child")],
                                     timeout=args.timeout)
    finally:
        stop_processes([server])
    result = SideResult("ceiling", tallies, sampler.max_pss, sampler.processes, sampler.samples,
                        args.context_length)
    result.notes.append(f"1 server + {args.ranks} clients; {len(paths)} captured step tables cycled")
    result.notes += sampler.summary()
    return result


def run_baseline(args, data_dir: Path, sources, seed: int) -> SideResult:
    tallies, sampler = run_ranks(
        "baseline", baseline_rank,
        [(sources, str(data_dir), args.ranks, args.workers, args.context_length, args.microbatches,
          args.warmup, args.steps, seed) for _ in range(args.ranks)],
        label="rank", child_label="worker", timeout=args.timeout)
    result = SideResult("baseline (colocated)", tallies, sampler.max_pss, sampler.processes, sampler.samples,
                        args.context_length)
    result.notes.append(f"{args.ranks} rank processes x {args.workers} DataLoader workers, each worker "
                        f"holding all {sum(len(list((data_dir / s).glob('*.parquet'))) for s, _, _ in sources)} "
                        f"Parquet files of {len(sources)} sources")
    result.notes += sampler.summary()
    return result


# ---------------------------------------------------------------------------------------------
# Corpus, report, main
# ---------------------------------------------------------------------------------------------

def demo_sources(count: int) -> tuple[list[tuple[str, float, int]], float, int]:
    """(name, weight, loaders) of the first ``count`` demo sources, the demo's fill and seed."""
    sources, fill, seed = FALLBACK_SOURCES, FALLBACK_FILL, 1234
    if DEMO_CONFIG.exists():
        raw = yaml.safe_load(DEMO_CONFIG.read_text())
        sources = [(s["name"], float(s.get("weight", 1.0)), int(s.get("loaders", 1))) for s in raw["sources"]]
        gb = raw["global_batch"]
        if gb.get("tokens_per_step"):
            fill = gb["tokens_per_step"] / ((raw.get("mesh") or {}).get("dp", 1) * gb.get("microbatches", 1)
                                            * gb["context_length"])
        seed = int(raw.get("seed", seed))
    return sources[:count], fill, seed


def check_byte_accounting(capture_dir: Path) -> str:
    """The baseline's byte count must equal Arrow's nbytes of the same microbatches."""
    from flight_overlord.client.trainer import table_to_microbatches
    tables = [pa.ipc.open_file(p).read_all() for p in sorted(capture_dir.glob("rank*-*.arrow"))]
    arrow = sum(t.nbytes for t in tables)
    ours = sum(microbatch_nbytes(mb) for t in tables for mb in table_to_microbatches(t))
    status = "equal" if arrow == ours else "DIFFERENT"
    return f"byte accounting: Arrow nbytes {arrow} vs per-microbatch count {ours} on {len(tables)} tables: {status}"


def report(results: list[SideResult], args, sources) -> None:
    print(f"{args.ranks} ranks, {args.microbatches} microbatches/step of {args.context_length} tokens, "
          f"{args.warmup} warm-up + {args.steps} timed steps per rank; "
          f"{len(sources)} sources ({', '.join(f'{n} {w:g}' for n, w, _ in sources)}); "
          f"baseline: {args.workers} workers/rank; corpus scale {args.scale:g}")
    print()
    print("| side | bytes/s (MB/s) | batches/s | total PSS (MiB) | processes |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r.side} | {r.bytes_per_s / 1e6:.1f} | {r.batches_per_s:.1f} | {r.pss / MiB:.0f} | {r.processes} |")
    print()
    by = {r.side.split()[0]: r for r in results}
    ceiling, overlord, baseline = by.get("ceiling"), by.get("flight_overlord"), by.get("baseline")
    if overlord and ceiling:
        print(f"- overlord / ceiling throughput: {overlord.bytes_per_s / ceiling.bytes_per_s:.3f} (bytes), "
              f"{overlord.batches_per_s / ceiling.batches_per_s:.3f} (batches)")
    if overlord and baseline:
        print(f"- overlord / baseline throughput: {overlord.bytes_per_s / baseline.bytes_per_s:.2f} (bytes), "
              f"{overlord.batches_per_s / baseline.batches_per_s:.2f} (batches)")
        print(f"- baseline / overlord memory (PSS): {baseline.pss / overlord.pss:.2f}")
    print()
    print("| side | timed s | microbatches | samples / microbatch | real tokens / slot | PSS samples |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        batches = r.total("batches")
        print(f"| {r.side} | {r.elapsed:.2f} | {batches} | {r.total('samples') / batches:.1f} | "
              f"{r.total('tokens') / (batches * r.context_length):.3f} | {r.pss_samples} |")
    print()
    for r in results:
        for note in r.notes:
            print(f"- {r.side}: {note}")


def parse_args(argv=None):
    p = argument_parser(__doc__)
    add_mesh_args(p, microbatches=4)
    p.add_argument("--workers", type=int, default=2, help="baseline DataLoader workers per rank (default 2)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per rank (default 30, --quick 8)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--sources", type=int, default=6, help="the first N demo sources (default all 6)")
    add_corpus_args(p, scale=1.0)
    p.add_argument("--quick", action="store_true", help="fewer steps (8)")
    p.add_argument("--timeout", type=float, default=600.0, help="per side, against hangs (seconds)")
    p.add_argument("--rounds", type=int, default=1,
                   help="flight_overlord and baseline runs, alternating order; median ratio reported (default 1)")
    args = p.parse_args(argv)
    args.steps = args.steps or (8 if args.quick else 30)
    if min(args.ranks, args.steps, args.context_length, args.microbatches, args.sources) < 1 or args.workers < 0:
        p.error("--ranks, --steps, --context-length, --microbatches, --sources must be >= 1; --workers >= 0")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    print_header()
    sources, fill, seed = demo_sources(args.sources)
    with workspace("bench-delivery-", args.data, [n for n, _, _ in sources], args.scale) as (tmp, data_dir):
        def config_for(name: str) -> Path:
            return write_config(tmp / f"{name}.yaml", data_dir,
                                [{"name": n, "weight": w, "loaders": lo} for n, w, lo in sources],
                                ranks=args.ranks, context_length=args.context_length, microbatches=args.microbatches,
                                tokens_per_step=int(args.ranks * args.microbatches * args.context_length * fill),
                                seed=seed, run_dir=tmp / f"run-{name}", balance={"method": "greedy"})

        capture_dir = tmp / "captured"
        capture_dir.mkdir()
        config = config_for("bench")
        overlord = run_overlord(args, config, capture_dir)
        log(f"[flight_overlord] {overlord.batches_per_s:.1f} batches/s")
        ceiling = run_ceiling(args, capture_dir)
        log(f"[ceiling] {ceiling.batches_per_s:.1f} batches/s")
        baseline = run_baseline(args, data_dir, sources, seed)
        log(f"[baseline] {baseline.batches_per_s:.1f} batches/s")
        print()
        report([ceiling, overlord, baseline], args, sources)
        print(f"- {check_byte_accounting(capture_dir)}")
        if args.rounds > 1:
            alternate_rounds(args, config_for, tmp, data_dir, sources, seed, (overlord, baseline))


def alternate_rounds(args, config_for, tmp: Path, data_dir: Path, sources, seed, first) -> None:
    """More rounds of flight_overlord and the baseline, in alternating order (baseline first in odd
    rounds): on a shared machine one pair of runs can meet very different loads, the median ratio
    over rounds is the figure to compare."""
    rows = [(1, first[0].batches_per_s, first[1].batches_per_s, os.getloadavg()[0])]
    for r in range(2, args.rounds + 1):
        capture = tmp / f"captured-{r}"
        capture.mkdir()
        sides = [lambda: run_overlord(args, config_for(f"round-{r}"), capture),
                 lambda: run_baseline(args, data_dir, sources, seed)]
        results = [side() for side in (sides if r % 2 else sides[::-1])]
        overlord, baseline = results if r % 2 else results[::-1]
        log(f"[round {r}] overlord {overlord.batches_per_s:.1f}, baseline {baseline.batches_per_s:.1f} batches/s")
        rows.append((r, overlord.batches_per_s, baseline.batches_per_s, os.getloadavg()[0]))
    print("\nAlternating rounds (flight_overlord vs baseline, microbatches/s; odd rounds run flight_overlord first):\n")
    print("| round | flight_overlord | baseline | ratio | load average (1 min) after |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for r, o, b, load in rows:
        print(f"| {r} | {o:.1f} | {b:.1f} | {o / b:.2f} | {load:.1f} |")
    ratios = [o / b for _, o, b, _ in rows]
    print(f"\n- median overlord / baseline over {len(rows)} rounds: {float(np.median(ratios)):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
