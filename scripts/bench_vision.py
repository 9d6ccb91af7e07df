#!/usr/bin/env python
"""Image-text samples: what each transform costs, and what decoding at the constructor saves.

Two parts, measured in one run on the same demo corpus (``make_demo_data(seed=0, scale=--scale)``):

1. transform cost  in this process, per sample: the byte tokenizer on text samples (captions,
                   longdocs) and, per image size class (small <= 160x160 px, medium, large >= 512 px
                   on the long side), the header-only patch count (``image_size`` + ``patch_grid``:
                   what a loader does) and the full decode (``decode_patches``: what a constructor
                   does, or a loader with ``vision.decode_at: loader``). Every sample is timed
                   --rounds times; median and mean over all of them. Then the loader's whole sample
                   transform (``transform_rows``) on real row groups, amortised per sample, with and
                   without the decode, and the bytes per sample it hands to the wire.
2. end to end      two ``LocalCluster`` deployments, ``vision.decode_at: constructor`` then
                   ``loader``, identical otherwise (imagecaps 0.5, interleaved 0.3, captions 0.2;
                   dp 2, 2 microbatches of 4096 tokens, ~12,000 tokens per step). A thread per rank
                   reads steps with ``StepFetcher``: --warmup steps, then --steps timed steps, the
                   ranks starting the timed phase together. Wire bytes are the loaders'
                   ``bytes_served`` and the constructors' ``bytes_fetched`` (Arrow nbytes of the
                   samples tables; gRPC/IPC framing not counted) read with ``cluster_status``
                   before and after the timed phase, so they include the same prefetch offset at
                   both ends. CPU and PSS per process kind come from psutil over the cluster's
                   child processes.

    .venv/bin/python scripts/bench_vision.py                # defaults: ~1 min on 2 cores
    .venv/bin/python scripts/bench_vision.py --steps 300    # longer timed phases
    .venv/bin/python scripts/bench_vision.py --data /tmp/demo --scale 1.0

The machine is shared: compare the two placements within one run; the notes say how much CPU
everything else used while each deployment was timed.
"""
from __future__ import annotations

import glob
import hashlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchlib import (MiB, PssSampler, add_corpus_args, add_mesh_args, argument_parser, cluster_roots, log,
                      plan_imbalance, print_header, workspace, write_config)
from flight_overlord.deploy.status import cluster_status
from flight_overlord.wire.server import ClientPool

SMALL_PIXELS = 160 * 160  # small: width * height at most this
LARGE_SIDE = 512          # large: the long side at least this; medium: neither
TEXT_SOURCES = ("captions", "longdocs")
IMAGE_SOURCES = ("imagecaps", "interleaved")
# (name, weight, image-text?) of the end-to-end deployments
DEPLOYMENT_SOURCES = (("imagecaps", 0.5, True), ("interleaved", 0.3, True), ("captions", 0.2, False))
PLACEMENTS = ("constructor", "loader")
MB = 1e6


# ---------------------------------------------------------------------------------------------
# Part 1: transform cost per sample, in this process
# ---------------------------------------------------------------------------------------------

def source_files(data_dir: Path, source: str) -> list[str]:
    return sorted(glob.glob(str(data_dir / source / "*.parquet")))


def column_values(data_dir: Path, source: str, column: str) -> list:
    """Every row of ``column`` over the source's files (lists are flattened, nulls dropped)."""
    values = []
    for path in source_files(data_dir, source):
        array = pq.read_table(path, columns=[column]).column(0)
        if pa.types.is_list(array.type):
            array = pc.list_flatten(array)
        values += [v for v in array.to_pylist() if v is not None]
    return values


def image_classes(data_dir: Path) -> dict[str, list[bytes]]:
    """Every image of the image-text sources, by size class."""
    from flight_overlord.core.vision import image_size
    classes: dict[str, list[bytes]] = {"small image": [], "medium image": [], "large image": []}
    for source in IMAGE_SOURCES:
        for data in column_values(data_dir, source, "images"):
            width, height = image_size(data)
            kind = ("small" if width * height <= SMALL_PIXELS else
                    "large" if max(width, height) >= LARGE_SIDE else "medium")
            classes[f"{kind} image"].append(data)
    return classes


def pick(rng: np.random.Generator, items: list, limit: int) -> list:
    if len(items) <= limit:
        return list(items)
    return [items[i] for i in sorted(rng.choice(len(items), limit, replace=False))]


def timed_us(fn, items: list, rounds: int) -> np.ndarray:
    """Microseconds of ``fn(item)``, every item timed once per round: shape [rounds, items]."""
    out = np.empty((rounds, len(items)))
    for r in range(rounds):
        for i, item in enumerate(items):
            start = time.perf_counter_ns()
            fn(item)
            out[r, i] = (time.perf_counter_ns() - start) / 1e3
    return out


@dataclass
class KindRow:
    """One kind of sample: what it looks like, and its transforms' cost per sample."""
    kind: str
    count: int
    size: str              # the median image's width x height ("-" for text)
    encoded: float         # median stored bytes
    patches: float | None  # median vision-encoder patches
    expansion: float       # bytes after the transform / bytes stored, summed over the samples
    costs: list[tuple[str, float, float | None]] = field(default_factory=list)  # (transform, median, mean) µs


def text_row(name: str, texts: list[str], tokenize, context_length: int, rounds: int) -> KindRow:
    sizes = [len(t.encode()) for t in texts]
    column = pa.array(texts, pa.string())
    tokens = tokenize(column, context_length)
    row = KindRow(f"text: {name}", len(texts), "-", float(np.median(sizes)), None,
                  tokens.values.nbytes / max(1, sum(sizes)))
    single = timed_us(lambda t: tokenize(pa.array([t], pa.string()), context_length), texts, rounds)
    row.costs.append(("byte_tokenizer, one sample per call", float(np.median(single)), float(single.mean())))
    whole = timed_us(lambda c: tokenize(c, context_length), [column], rounds) / len(texts)
    row.costs.append(("byte_tokenizer, all in one call (amortised)", float(np.median(whole)), None))
    return row


def image_row(kind: str, images: list[bytes], spec, rounds: int) -> KindRow:
    from flight_overlord.core.vision import decode_patches, image_size, num_patches, patch_grid
    sizes = [image_size(data) for data in images]
    grids = [patch_grid(w, h, spec) for w, h in sizes]
    patches = [num_patches(g) for g in grids]
    area = [w * h for w, h in sizes]
    w, h = sizes[int(np.argsort(area)[len(area) // 2])]
    encoded = [len(data) for data in images]
    decoded = sum(patches) * 3 * spec.patch_size ** 2
    row = KindRow(kind, len(images), f"{w}x{h} px", float(np.median(encoded)), float(np.median(patches)),
                  decoded / sum(encoded))
    header = timed_us(lambda data: patch_grid(*image_size(data), spec), images, rounds)
    row.costs.append(("header only: image_size + patch_grid", float(np.median(header)), float(header.mean())))
    decode = timed_us(lambda data: decode_patches(data, spec), images, rounds)
    row.costs.append(("full decode: decode_patches", float(np.median(decode)), float(decode.mean())))
    return row


@dataclass
class RowGroupRow:
    """The loader's sample transform on real row groups of one source, per sample."""
    source: str
    samples: int
    us: dict[str, float]      # decode_at -> µs per sample (median over rounds)
    bytes: dict[str, float]   # decode_at -> bytes per sample handed to the wire (tokens + images)


def row_group_rows(data_dir: Path, tokenize, vision, context_length: int, row_groups: int,
                   rounds: int) -> list[RowGroupRow]:
    from flight_overlord.transforms.image_text import transform_rows
    rows = []
    for source in (*TEXT_SOURCES, *IMAGE_SOURCES):
        path = source_files(data_dir, source)[0]
        parquet = pq.ParquetFile(path)
        groups = range(min(row_groups, parquet.num_row_groups))
        image_text = source in IMAGE_SOURCES
        columns = ["texts", "images"] if image_text else ["text"]
        tables = [parquet.read_row_group(g, columns=columns) for g in groups]
        samples = sum(t.num_rows for t in tables)
        us, nbytes = {}, {}
        for decode_at in PLACEMENTS:
            if image_text:
                def transform(table, decode=decode_at == "loader"):
                    texts, images = (table.column(c).combine_chunks() for c in columns)
                    return transform_rows(texts, images, tokenize, vision, context_length, decode=decode)
                out = [transform(t) for t in tables]
                nbytes[decode_at] = sum(4 * len(tok) + sum(len(b) for b in img)
                                        for o in out for tok, img in zip(o.tokens, o.images)) / samples
            else:
                def transform(table):
                    return tokenize(table.column(0).combine_chunks(), context_length)
                nbytes[decode_at] = sum(transform(t).values.nbytes for t in tables) / samples
            us[decode_at] = float(np.median(timed_us(transform, tables, rounds).sum(axis=1))) / samples
        rows.append(RowGroupRow(source, samples, us, nbytes))
    return rows


def run_transforms(args, data_dir: Path) -> tuple[list[KindRow], list[RowGroupRow]]:
    from flight_overlord.config import VisionConfig
    from flight_overlord.transforms import make_transform
    rng = np.random.default_rng(0)
    tokenize = make_transform("byte_tokenizer")
    vision = VisionConfig(patch_size=14, merge_size=2)
    spec = vision.spec
    kinds = [text_row(name, pick(rng, column_values(data_dir, name, "text"), args.samples), tokenize,
                      args.context_length, args.rounds) for name in TEXT_SOURCES]
    for kind, images in image_classes(data_dir).items():
        if images:
            kinds.append(image_row(kind, pick(rng, images, args.samples), spec, args.rounds))
    return kinds, row_group_rows(data_dir, tokenize, vision, args.context_length, args.row_groups, args.rounds)


# ---------------------------------------------------------------------------------------------
# Part 2: end to end, decode_at constructor vs loader
# ---------------------------------------------------------------------------------------------

def deployment_config(path: Path, data_dir: Path, args, decode_at: str) -> Path:
    sources = [{"name": name, "weight": weight, **({"text_column": "texts", "image_column": "images"} if image_text else {})}
               for name, weight, image_text in DEPLOYMENT_SOURCES]
    return write_config(path, data_dir, sources, ranks=args.ranks, context_length=args.context_length,
                        microbatches=args.microbatches, tokens_per_step=args.tokens_per_step, seed=0,
                        run_dir=path.parent / f"run-{decode_at}",
                        vision={"decode_at": decode_at, "patch_size": 14, "merge_size": 2})


def wire_counters(planner: str, pool: ClientPool) -> dict[str, int | None]:
    """Bytes served by the loaders of each source, fetched by all constructors (None: no such source),
    and the constructors' bad samples: from ``cluster_status``, which must find every role up."""
    status = cluster_status(planner, pool=pool)
    if not status["up"]:
        raise RuntimeError(f"roles down: {'; '.join(status['totals']['down'])}")
    totals = status["totals"]
    out: dict[str, int | None] = {f"served:{name}": totals["bytes_served_by_source"].get(name)
                                  for name, _, _ in DEPLOYMENT_SOURCES}
    out["fetched"] = totals["bytes_fetched"]
    out["bad_samples"] = totals["bad_samples"]
    return out


@dataclass
class RankTally:
    """What one rank received in the timed phase."""
    steps: int = 0
    samples: int = 0
    patches: int = 0
    bytes: int = 0
    pixel_bytes: int = 0
    step_patches: list[int] = field(default_factory=list)
    t1: float = 0.0
    digest: object = field(default_factory=hashlib.blake2b)  # of the sample keys and grids received
    error: str | None = None

    def add(self, table: pa.Table) -> None:
        keys = pc.list_flatten(table.column("sample_keys"))
        grids = pc.list_flatten(table.column("image_grid_thw")).to_numpy().reshape(-1, 3)
        self.steps += 1
        self.samples += len(keys)
        self.step_patches.append(int(grids.prod(axis=1).sum()))
        self.patches += self.step_patches[-1]
        self.bytes += table.nbytes
        self.pixel_bytes += len(pc.list_flatten(table.column("pixel_values")))
        self.digest.update("\n".join(keys.to_pylist()).encode() + grids.astype(np.int32).tobytes())


def read_rank(planner: str, rank: int, args, barrier: threading.Barrier, tally: RankTally) -> None:
    from flight_overlord.client.trainer import StepFetcher
    fetcher = StepFetcher(planner, rank, timeout=args.timeout)
    try:
        for step in range(args.warmup):
            fetcher.fetch(step)
        barrier.wait()
        for step in range(args.warmup, args.warmup + args.steps):
            tally.add(fetcher.fetch(step))
        tally.t1 = time.monotonic()
    except Exception as exc:  # noqa: BLE001 - reported by the driver
        tally.error = f"rank {rank}: {type(exc).__name__}: {exc}"
        barrier.abort()
    finally:
        fetcher.close()


@dataclass
class Deployment:
    decode_at: str
    tallies: list[RankTally]
    elapsed: float
    before: dict[str, int | None]
    after: dict[str, int | None]
    sampler: PssSampler
    driver_cpu: float
    steps: int
    bad_samples: int
    notes: list[str] = field(default_factory=list)

    def total(self, name: str) -> int:
        return sum(getattr(t, name) for t in self.tallies)

    @property
    def patch_imbalance(self) -> float:
        """Image patches of the busiest rank over the mean rank, averaged over the timed steps."""
        per_step = np.array([t.step_patches for t in self.tallies], dtype=float)  # [ranks, steps]
        return float(np.mean(per_step.max(axis=0) / np.maximum(per_step.mean(axis=0), 1.0)))

    def rate(self, name: str) -> float:
        return self.total(name) / self.elapsed

    def counter(self, key: str) -> float | None:
        """A wire counter's growth over the timed phase, per step (None: not available)."""
        if self.before.get(key) is None or self.after.get(key) is None:
            return None
        return (self.after[key] - self.before[key]) / self.steps

    @property
    def served(self) -> float | None:
        per_source = [self.counter(f"served:{name}") for name, _, _ in DEPLOYMENT_SOURCES]
        return None if None in per_source else sum(per_source)

    def cpu(self, prefix: str) -> float:
        """CPU seconds per step of the process kinds whose label starts with ``prefix``."""
        return sum(c for label, c in self.sampler.cpu_by_label.items() if label.startswith(prefix)) / self.steps


def run_deployment(args, config: Path, decode_at: str) -> Deployment:
    from flight_overlord.deploy.launch import LocalCluster

    started = time.monotonic()
    with LocalCluster(config) as cluster:
        log(f"[{decode_at}] {len(cluster.children)} role processes up in {time.monotonic() - started:.1f}s")
        roles = cluster_roots(cluster, by_source=True)
        pool = ClientPool()
        sampler = PssSampler(lambda: roles)
        start: dict = {}

        def begin_timing() -> None:  # run by the last rank to finish warming up, before any timed fetch
            try:
                start["counters"] = wire_counters(cluster.planner, pool)
                sampler.sample()
                sampler.start()
                start["cpu"], start["t0"] = time.process_time(), time.monotonic()
            except Exception as exc:  # the barrier then breaks, and the ranks stop
                start["error"] = f"starting the timed phase: {type(exc).__name__}: {exc}"
                raise

        barrier = threading.Barrier(args.ranks, action=begin_timing)
        tallies = [RankTally() for _ in range(args.ranks)]
        threads = [threading.Thread(target=read_rank, args=(cluster.planner, r, args, barrier, tallies[r]),
                                    name=f"rank{r}", daemon=True) for r in range(args.ranks)]
        try:
            for t in threads:
                t.start()
            deadline = time.monotonic() + args.timeout
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            errors = [start["error"]] if "error" in start else [t.error for t in tallies if t.error]
            if errors:
                raise RuntimeError("; ".join(errors))
            if any(t.is_alive() for t in threads):
                raise TimeoutError(f"[{decode_at}] ranks not done after {args.timeout:.0f}s")
            sampler.stop()
            driver_cpu = time.process_time() - start["cpu"]
            after = wire_counters(cluster.planner, pool)
            imbalance = plan_imbalance(cluster.planner, args.warmup, args.warmup + args.steps - 1)
        finally:
            pool.close()  # on an error the sampler's daemon thread samples on until the script exits
    elapsed = max(t.t1 for t in tallies) - start["t0"]
    result = Deployment(decode_at, tallies, elapsed, start["counters"], after, sampler, driver_cpu, args.steps,
                        after["bad_samples"])
    result.notes.append(imbalance)
    result.notes.append(f"image patches per rank, max/mean, mean over the timed steps: {result.patch_imbalance:.3f}")
    result.notes += sampler.summary()
    return result


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def fmt(value: float | None, pattern: str = "{:.2f}", missing: str = "n/a") -> str:
    return missing if value is None else pattern.format(value)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def report_transforms(kinds: list[KindRow], groups: list[RowGroupRow], args) -> None:
    print(f"## 1. Transform cost per sample (this process, {args.rounds} rounds over up to {args.samples} "
          f"samples per kind; small <= {int(SMALL_PIXELS ** 0.5)}x{int(SMALL_PIXELS ** 0.5)} px, "
          f"large >= {LARGE_SIDE} px long side; patch 14, merge 2)")
    print()
    print("| kind | samples | median pixels | median stored bytes | median patches | bytes after / stored |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for k in kinds:
        print(f"| {k.kind} | {k.count} | {k.size} | {k.encoded:,.0f} | {fmt(k.patches, '{:.0f}', '-')} | "
              f"{k.expansion:.1f} |")
    print()
    print("(bytes after: int32 tokens for text, uint8 patch rows for images, over the stored UTF-8 or "
          "encoded bytes.)")
    print()
    alone, amortised = (cost for _, cost, _ in kinds[0].costs[:2])  # the first text kind
    print(f"x text: the row's median over the median {kinds[0].kind.split()[-1]} sample's, tokenized alone "
          "(one sample per call) or amortised (all in one call, as the loader does per row group):")
    print()
    print("| kind | transform | median µs | mean µs | x text, one per call | x text, amortised |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for k in kinds:
        for name, median, mean in k.costs:
            print(f"| {k.kind} | {name} | {median:.2f} | {fmt(mean, '{:.2f}', '-')} | {median / alone:.2f} | "
                  f"{median / amortised:,.0f} |")
    print()
    print(f"The loader's sample transform on the first {args.row_groups} row groups of each source "
          "(text: byte_tokenizer; image-text: multimodal.transform_rows), per sample, median over rounds; "
          "bytes = tokens (int32) + images handed to the wire:")
    print()
    print("| source | samples | µs, decode_at: constructor | µs, decode_at: loader | loader / constructor | "
          "bytes, constructor | bytes, loader | loader / constructor |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for g in groups:
        c, lo = g.us["constructor"], g.us["loader"]
        bc, bl = g.bytes["constructor"], g.bytes["loader"]
        print(f"| {g.source} | {g.samples} | {c:.1f} | {lo:.1f} | {lo / c:.1f} | {bc:,.0f} | {bl:,.0f} | "
              f"{bl / bc:.1f} |")
    print()


def report_deployments(runs: list[Deployment], args) -> None:
    sources = ", ".join(f"{n} {w:g}" for n, w, _ in DEPLOYMENT_SOURCES)
    print(f"## 2. End to end: {args.ranks} ranks, {args.microbatches} microbatches of {args.context_length} "
          f"tokens, {args.tokens_per_step} tokens/step; {sources}; {args.warmup} warm-up + {args.steps} "
          "timed steps per rank; the placements run one after the other")
    print()
    print("| decode_at | timed s | steps/s | samples/s | image patches/s | delivered MB/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in runs:
        print(f"| {r.decode_at} | {r.elapsed:.2f} | {r.steps / r.elapsed:.1f} | {r.rate('samples'):.0f} | "
              f"{r.rate('patches'):,.0f} | {r.rate('bytes') / MB:.1f} |")
    print()
    print("Bytes per step (MB): loaders -> constructors (sum of the loaders' bytes_served, and by source), "
          "what the constructors fetched (bytes_fetched), constructors -> trainers (sum of table.nbytes; "
          "pixel_values alone):")
    print()
    names = [n for n, _, _ in DEPLOYMENT_SOURCES]
    print("| decode_at | wire: bytes_served | " + " | ".join(f"of which {n}" for n in names)
          + " | bytes_fetched | delivered | of which pixel_values | wire / delivered |")
    print("| --- | ---: | " + " | ".join("---:" for _ in names) + " | ---: | ---: | ---: | ---: |")
    for r in runs:
        delivered = r.total("bytes") / r.steps
        cells = [fmt(ratio(r.counter(f"served:{n}"), MB), "{:.3f}") for n in names]
        print(f"| {r.decode_at} | {fmt(ratio(r.served, MB), '{:.3f}')} | " + " | ".join(cells)
              + f" | {fmt(ratio(r.counter('fetched'), MB), '{:.3f}')} | {delivered / MB:.3f} | "
              f"{r.total('pixel_bytes') / r.steps / MB:.3f} | {fmt(ratio(r.served, delivered))} |")
    print()
    print("CPU per process kind over the timed phase (psutil; the driver is this process: the rank "
          "threads fetching and tallying, plus the sampler) and PSS at the max:")
    print()
    print("| decode_at | process | processes | CPU ms/step | cores while timed | PSS MiB |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in runs:
        for label, (n, pss) in sorted(r.sampler.pss_by_label.items()):
            cpu = r.sampler.cpu_by_label.get(label, 0.0)
            print(f"| {r.decode_at} | {label} | {n} | {1e3 * cpu / r.steps:.1f} | {cpu / r.elapsed:.2f} | "
                  f"{pss / MiB:.0f} |")
        print(f"| {r.decode_at} | driver (rank threads) | 1 | {1e3 * r.driver_cpu / r.steps:.1f} | "
              f"{r.driver_cpu / r.elapsed:.2f} | - |")
    print()
    for r in runs:
        print(f"- {r.decode_at}: samples skipped for a bad image (constructors' bad_samples): {r.bad_samples}")
        for note in r.notes:
            print(f"- {r.decode_at}: {note}")
    print()


def report_reading(kinds: list[KindRow], groups: list[RowGroupRow], runs: list[Deployment]) -> None:
    by = {r.decode_at: r for r in runs}
    c, lo = by["constructor"], by["loader"]
    print("## Reading")
    print()
    text = kinds[0]
    alone, amortised = (cost for _, cost, _ in text.costs[:2])
    for k in kinds:
        if k.kind.endswith("image"):
            header, decode = k.costs[0][1], k.costs[1][1]
            print(f"- {k.kind} ({k.size}, {fmt(k.patches, '{:.0f}')} patches): header-only patch count "
                  f"{header:.0f} µs = {header / alone:.1f}x tokenizing one {text.kind.split()[-1]} sample alone "
                  f"({header / amortised:,.0f}x amortised); full decode {decode:,.0f} µs = {decode / header:.0f}x "
                  f"the header read, {decode / alone:.0f}x ({decode / amortised:,.0f}x) the text sample; "
                  f"decoded patches are {k.expansion:.1f}x the stored bytes")
    for g in groups:
        if g.source in IMAGE_SOURCES:
            print(f"- {g.source} loader transform: decoding at the loader costs "
                  f"{g.us['loader'] / g.us['constructor']:.1f}x per sample and hands "
                  f"{g.bytes['loader'] / g.bytes['constructor']:.1f}x the bytes to the wire")
    wire = ratio(lo.served, c.served)
    print(f"- wire bytes per step (loaders -> constructors), decode_at loader / constructor: {fmt(wire)}x "
          f"({fmt(ratio(lo.served, MB), '{:.2f}')} vs {fmt(ratio(c.served, MB), '{:.2f}')} MB)")
    checks = [f"{r.decode_at} {fmt(ratio(r.counter('fetched'), r.served), '{:.3f}')}" for r in runs]
    print(f"- bytes_fetched / bytes_served: {', '.join(checks)} (1 but for the fetches in flight at the two "
          "readings: a loader counts a table before sending it, a constructor after receiving it)")
    print(f"- delivered bytes per step, loader / constructor: "
          f"{lo.total('bytes') / lo.steps / (c.total('bytes') / c.steps):.3f}; same samples and grids on every "
          f"rank in both runs: {all(a.digest.digest() == b.digest.digest() for a, b in zip(c.tallies, lo.tallies))}")
    print(f"- loader CPU per step, loader / constructor: {fmt(ratio(lo.cpu('loader'), c.cpu('loader')))}x "
          f"({1e3 * lo.cpu('loader'):.0f} vs {1e3 * c.cpu('loader'):.0f} ms); constructor CPU per step: "
          f"{fmt(ratio(lo.cpu('constructor'), c.cpu('constructor')))}x "
          f"({1e3 * lo.cpu('constructor'):.0f} vs {1e3 * c.cpu('constructor'):.0f} ms)")
    loader_pss = {r.decode_at: sum(p for label, (_, p) in r.sampler.pss_by_label.items()
                                   if label.startswith("loader")) for r in runs}
    total = {r.decode_at: sum(r.sampler.cpu_by_label.values()) / r.steps + r.driver_cpu / r.steps for r in runs}
    print(f"- CPU of the whole deployment per step (every role process + the driver), loader / constructor: "
          f"{total['loader'] / total['constructor']:.2f}x ({1e3 * total['loader']:.0f} vs "
          f"{1e3 * total['constructor']:.0f} ms)")
    print(f"- loaders' PSS, loader / constructor: {ratio(loader_pss['loader'], loader_pss['constructor']):.2f}x "
          f"({loader_pss['loader'] / MiB:.0f} vs {loader_pss['constructor'] / MiB:.0f} MiB)")
    for r in runs:
        label, cpu = max(((label, c / r.sampler.pss_by_label.get(label, (1, 0))[0])
                          for label, c in r.sampler.cpu_by_label.items()), key=lambda lc: lc[1])
        print(f"- busiest single process, decode_at {r.decode_at}: {label} at {cpu / r.elapsed:.2f} cores")
    print(f"- throughput, loader / constructor: {(lo.steps / lo.elapsed) / (c.steps / c.elapsed):.2f}x steps/s "
          f"({lo.steps / lo.elapsed:.1f} vs {c.steps / c.elapsed:.1f}); on this machine every process "
          "shares 2 cores, so a placement that moves CPU between processes does not show as a network saving")


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argument_parser(__doc__)
    p.add_argument("--steps", type=int, default=100, help="timed steps per rank and placement (default 100)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    add_corpus_args(p, scale=0.3)
    p.add_argument("--samples", type=int, default=120, help="samples per kind for part 1 (default 120)")
    p.add_argument("--rounds", type=int, default=3, help="times each sample is timed in part 1 (default 3)")
    p.add_argument("--row-groups", type=int, default=2, help="row groups per source for the loader transform")
    add_mesh_args(p, microbatches=2)
    p.add_argument("--tokens-per-step", type=int, default=12000)
    p.add_argument("--timeout", type=float, default=300.0, help="per placement, against hangs (seconds)")
    args = p.parse_args(argv)
    if min(args.steps, args.samples, args.rounds, args.row_groups, args.ranks, args.context_length,
           args.microbatches, args.tokens_per_step) < 1 or args.warmup < 0:
        p.error("--steps, --samples, --rounds, --row-groups, --ranks, --context-length, --microbatches and "
                "--tokens-per-step must be >= 1; --warmup >= 0")
    return args


def main(argv=None) -> None:
    import PIL
    from PIL import features

    args = parse_args(argv)
    print_header(f"; Pillow {PIL.__version__} (libjpeg {features.version('jpg')}, zlib {features.version('zlib')})")
    print()
    with workspace("bench-vision-", args.data, [*TEXT_SOURCES, *IMAGE_SOURCES], args.scale) as (tmp, data_dir):
        part1 = time.monotonic()
        kinds, groups = run_transforms(args, data_dir)
        log(f"[transforms] {time.monotonic() - part1:.1f}s")
        runs = []
        for decode_at in PLACEMENTS:
            run = run_deployment(args, deployment_config(tmp / f"{decode_at}.yaml", data_dir, args, decode_at),
                                 decode_at)
            log(f"[{decode_at}] {run.steps / run.elapsed:.1f} steps/s")
            runs.append(run)
        report_transforms(kinds, groups, args)
        report_deployments(runs, args)
        report_reading(kinds, groups, runs)


if __name__ == "__main__":
    main()
