"""Memory and samples/s of flight_overlord beside MosaicML Streaming and the colocated DataLoader.

Same corpus (``overlord make-demo-data --sources N``; a run with S sources uses the first S,
equal weights), same work per rank and step (``--microbatches`` packed microbatches of
``--context-length`` tokens, byte-tokenized text), same ranks, all in one run. Measured: PSS summed
over every process of a side (trainer processes and their DataLoader workers counted on every
side), sampled every second of the timed steps; the max is reported; samples/s over the timed steps
of all ranks; the CPU cores of each kind of process while timed. Every side runs ``--rounds`` times
per cell (3), the order of the sides reversed each round; the table shows medians. The defaults
(20 warm-up and 300 timed steps) are long enough to trust samples/s; a 16-step run is not.

  flight_overlord  ``LocalCluster`` (Planner, loader hosts, Data Constructors) plus one
                   ``TrainerClient`` process per rank (benchmarks.delivery.throughput's trainer, torch tensors).
                   ``default``: the config's defaults (one constructor per rank); ``single_node``:
                   the named setting ``deployment: single_node`` (one loader process, one
                   constructor building every rank's batches; the same plans and streams); ``node``:
                   ``constructor.dp_per_constructor: R`` only; ``node1``: that and ``loader.hosts: 1``;
                   ``+lean``, ``+raN``, ``+slNm``: benchmarks.memory.sources_ranks' loader settings on top.
  Streaming        ``mosaicml-streaming`` 0.13 (``pip install -e '.[peers]'``): the corpus converted
                   to MDS by this script (one dataset per source, columns key and text), per rank a
                   ``StreamingDataset`` with one ``Stream`` per source (proportion 1/S), a torch
                   DataLoader with ``--workers`` workers, the same byte tokenizer and greedy
                   packing as the colocated side, inside the workers.
  colocated        benchmarks.delivery.throughput's baseline: per rank a DataLoader with ``--workers`` workers, each
                   worker opening every file of every source (skipped where its fitted size passes
                   ``--max-gib``).

    .venv/bin/python -m benchmarks.memory.peers --data /tmp/c96 --no-colocated  # 6, 96 sources x 2, 8 ranks
    .venv/bin/python -m benchmarks.memory.peers --data /tmp/c96 --sources 96 --ranks 2 --no-colocated \
        --variants default,single_node,single_node+lean --rounds 1
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import colocated
from benchmarks.common.benchlib import MiB, add_run_args, argument_parser, log, print_header, workspace
from benchmarks.common.s3 import free_port
from benchmarks.delivery import throughput as bd
from benchmarks.memory import runs as bm  # benchmarks.memory.sources_ranks' runs

GiB = 1024 * MiB


def _import_streaming():
    """``import streaming``: it imports torchvision for its vision datasets; where the installed
    torchvision does not match the CPU torch (its C++ ops fail to register), stand in empty modules
    for the two names it imports (text datasets never use them; it only makes Streaming's processes
    smaller, so the comparison errs in Streaming's favour)."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure of torchvision
        import importlib.machinery
        import types
        for name in [n for n in sys.modules if n.startswith("torchvision")]:
            del sys.modules[name]
        stub = {name: types.ModuleType(name) for name in
                ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional")}
        for name, module in stub.items():
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        stub["torchvision.datasets"].VisionDataset = type("VisionDataset", (), {})
        stub["torchvision.datasets"].CIFAR10 = None
        stub["torchvision.transforms.functional"].to_tensor = None
        sys.modules.update(stub)
    import streaming
    return streaming


def convert_to_mds(data_dir: Path, names: list[str], out: Path) -> list[Path]:
    """Each source's Parquet rows as an MDS dataset ``out/NAME`` (key, text); kept for later runs."""
    import pyarrow.parquet as pq
    streaming = _import_streaming()
    dirs = []
    for name in names:
        target = out / name
        dirs.append(target)
        if (target / "index.json").exists():
            continue
        with streaming.MDSWriter(out=str(target), columns={"key": "str", "text": "str"}) as writer:
            for path in sorted((data_dir / name).glob("*.parquet")):
                texts = pq.read_table(path, columns=["text"]).column("text").to_pylist()
                for row, text in enumerate(texts):
                    writer.write({"key": f"{name}:{path.name}:{row}", "text": text or ""})
    return dirs


def streaming_rank(channel, mds_dirs: list[str], ranks: int, workers: int, context_length: int,
                   microbatches: int, warmup: int, steps: int, seed: int, port: int) -> None:
    """One rank: Streaming's dataset over every source, packed microbatches from its DataLoader.
    Streaming joins torch.distributed (gloo, loopback) itself from the launcher's variables."""
    os.environ.update({"RANK": str(channel.rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(channel.rank),
                       "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    streaming = _import_streaming()
    from torch.utils.data import IterableDataset

    pack_into = colocated._make_colocated_dataset([], "", 0, 1, context_length, 0, seed)._microbatch  # the same packing

    class Packed(IterableDataset):
        def __init__(self):
            streams = [streaming.Stream(local=d, proportion=1.0 / len(mds_dirs)) for d in mds_dirs]
            self.samples = streaming.StreamingDataset(streams=streams, batch_size=16, shuffle=True,
                                                      shuffle_seed=seed, epoch_size=1 << 22)

        def __iter__(self):
            pending, used = [], 0
            for sample in self.samples:
                tokens = np.frombuffer(sample["text"].encode(), np.uint8)[:context_length].astype(np.int32)
                if pending and used + len(tokens) > context_length:
                    yield pack_into(pending)
                    pending, used = [], 0
                pending.append((sample["key"], tokens))
                used += len(tokens)

    colocated.timed_microbatches(channel, colocated.worker_loader(Packed(), workers), microbatches, warmup, steps)


def run_streaming(args, mds_dirs: list[Path], ranks: int) -> bm.Run:
    streaming = _import_streaming()
    streaming.base.util.clean_stale_shared_memory()
    log(f"[streaming S={len(mds_dirs)} R={ranks} W={args.workers}]")
    run = bm.Run("streaming", len(mds_dirs), ranks, None)
    started, port = time.monotonic(), free_port()
    tallies, sampler = bd.run_ranks(
        "streaming", streaming_rank,
        [([str(d) for d in mds_dirs], ranks, args.workers, args.context_length, args.microbatches,
          args.warmup, args.steps, args.seed, port) for _ in range(ranks)],
        label="rank", child_label="worker", timeout=args.timeout)
    run.start_s = time.monotonic() - started
    return bm.measured(run, tallies, sampler)


def deployment(variant: str, ranks: int) -> tuple[int | str | None, dict]:
    """(loader.hosts, further config sections) of a flight_overlord variant: ``default``; ``single_node``
    (the named setting: ``deployment: single_node``); ``node`` (``constructor.dp_per_constructor: R``),
    ``node1`` (and ``loader.hosts: 1``); any of them ``+`` loader settings (``+lean``, ``+ra1``:
    ``benchmarks.memory.runs.loader_settings``)."""
    name = variant.split("+")[0]
    if name == "single_node":
        return None, {"deployment": "single_node"}
    sections = {"constructor": {"dp_per_constructor": ranks}} if name.startswith("node") else {}
    return (1 if name == "node1" else "auto"), sections


def sides(args) -> list[tuple[str, str]]:
    """(side, variant) of every run of a cell, in the first round's order."""
    return ([("overlord", v) for v in args.variants] + [("streaming", "")] * (not args.no_streaming)
            + [("colocated", "")] * (not args.no_colocated))


def one_run(args, tmp: Path, data_dir: Path, mds_root: Path, names: list[str], ranks: int, side: str,
            variant: str) -> bm.Run:
    """One side's run at len(names) sources x ``ranks`` (a failure is a run with its error, for the table)."""
    try:
        if side == "overlord":
            hosts, sections = deployment(variant, ranks)
            return bm.run_overlord(args, tmp, data_dir, names, ranks, hosts, variant, sections)
        if side == "streaming":
            return run_streaming(args, convert_to_mds(data_dir, names, mds_root), ranks)
        if bm.fitted_colocated(len(names), ranks, args.workers) > args.max_gib * GiB:
            return bm.Run("colocated", len(names), ranks, None, error="skipped (fit above --max-gib)")
        return bm.run_colocated(args, data_dir, names, ranks)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        log(f"{side} {variant} S={len(names)} R={ranks} failed: {exc}")
        return bm.Run(side, len(names), ranks, None, variant, error=f"failed: {type(exc).__name__}")


def rounds(args, tmp: Path, data_dir: Path, mds_root: Path, names: list[str]) -> list[tuple[int, float, bm.Run]]:
    """Every cell's sides, ``--rounds`` times; each round runs the sides in the reverse order of the one
    before, so that no side always runs first (a cold page cache) or last (a warmed machine)."""
    runs = []
    for round_ in range(args.rounds):
        (tmp / f"round{round_}").mkdir(exist_ok=True)  # each round's run dirs apart (a run dir is never reused)
        for s in sorted(args.sources):
            for r in sorted(args.ranks):
                order = sides(args) if round_ % 2 == 0 else sides(args)[::-1]
                for side, variant in order:
                    load = os.getloadavg()[0]  # other users of the machine: the figures' caveat
                    run = one_run(args, tmp / f"round{round_}", data_dir, mds_root, names[:s], r, side, variant)
                    runs.append((round_, load, run))
                    if not run.error:
                        log(f"round {round_} {title(side, variant)} S={s} R={r}: {run.samples_per_s:.0f} samples/s, "
                            f"{run.max_pss / MiB:.0f} MiB (load average {load:.1f} at its start)")
    return runs


def title(side: str, variant: str) -> str:
    return f"flight_overlord {variant}" if side == "overlord" else side


def table(runs: list[tuple[int, float, bm.Run]], args) -> None:
    """Medians over the rounds: PSS (max of each run) and samples/s per side, and flight_overlord's ratios
    to Streaming (of the medians); then every run with the PSS and CPU of each kind of process."""
    def median(values):
        return float(np.median(values)) if values else float("nan")

    kinds = sides(args)
    print(f"\nMedians of {args.rounds} rounds ({args.steps} timed steps after {args.warmup} warm-up, "
          f"{args.microbatches} microbatches of {args.context_length} tokens per rank and step):")
    print("\n| S | R | " + " | ".join(f"{title(s, v)} GiB (samples/s)" for s, v in kinds)
          + " | " + " | ".join(f"{title('overlord', v)} / Streaming: samples/s, PSS" for v in args.variants) + " |")
    print("| ---: " * (2 + len(kinds) + len(args.variants)) + "|")
    for s, r in sorted({(x.sources, x.ranks) for _, _, x in runs}):
        got = {k: [x for _, _, x in runs if (x.sources, x.ranks, x.side, x.variant) == (s, r, *k) and not x.error]
               for k in kinds}
        pss = {k: median([x.max_pss for x in v]) for k, v in got.items()}
        rate = {k: median([x.samples_per_s for x in v]) for k, v in got.items()}
        cells = [f"{pss[k] / GiB:.3f} ({rate[k]:.0f}), n={len(got[k])}" if got[k] else "-" for k in kinds]
        peer = ("streaming", "")
        ratios = [f"**{rate[('overlord', v)] / rate[peer]:.2f}x, {pss[('overlord', v)] / pss[peer]:.3f}x**"
                  if got[("overlord", v)] and got.get(peer) else "-" for v in args.variants]
        print(f"| {s} | {r} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    print("\nEvery run: samples/s, max total PSS; per kind of process: count x PSS at the max (MiB), CPU "
          "cores while timed (all of that kind):")
    for round_, load, x in runs:
        if x.error:
            print(f"- round {round_} {title(x.side, x.variant)} S={x.sources} R={x.ranks}: {x.error}")
            continue
        per_kind = ", ".join(f"{k} {n}x {p / MiB:.0f} MiB {x.cores_by_label.get(k, float('nan')):.2f} cores"
                             for k, (n, p) in sorted(x.by_label.items()))
        print(f"- round {round_} {title(x.side, x.variant)} S={x.sources} R={x.ranks}: {x.samples_per_s:.0f} "
              f"samples/s, {x.max_pss / MiB:.0f} MiB; {per_kind}; total "
              f"{sum(x.cores_by_label.values()):.2f} cores; load average {load:.1f} at its start")


def parse_args(argv=None):
    p = argument_parser(__doc__)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p.add_argument("--data", type=Path, help="corpus dir (make_many_sources; generated if missing)")
    p.add_argument("--sources", type=ints, default=[6, 96])
    p.add_argument("--ranks", type=ints, default=[2, 8])
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers per rank (Streaming, colocated)")
    p.add_argument("--rounds", type=int, default=3, help="runs of every side per cell, alternating their order; "
                   "the table shows medians")
    p.add_argument("--variants", type=lambda t: t.split(","), default=["single_node"],
                   help="flight_overlord deployments: default; single_node (deployment: single_node); node (one "
                        "constructor process per node); node1 (and one loader host process); each may add +lean, "
                        "+raN (benchmarks.memory.sources_ranks' loader settings)")
    p.add_argument("--no-colocated", action="store_true")
    p.add_argument("--no-streaming", action="store_true", help="flight_overlord's variants only (a before/after "
                   "of a change: no ratio to Streaming then)")
    p.add_argument("--max-gib", type=float, default=12.0, help="skip colocated runs fitted above this")
    add_run_args(p, steps=300, warmup=20, timeout=900.0)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    print_header()
    with workspace("bench-peers-", args.data, [], 1.0) as (tmp, data_dir):
        names = bm.ensure_many(data_dir, max(args.sources), args)
        mds_root = data_dir.with_name(f"{data_dir.name}-mds")
        table(rounds(args, tmp, data_dir, mds_root, names), args)


if __name__ == "__main__":
    main()
