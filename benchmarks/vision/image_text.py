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

    .venv/bin/python -m benchmarks.vision.image_text              # defaults: ~1 min on 2 cores
    .venv/bin/python -m benchmarks.vision.image_text --steps 300  # longer timed phases
    .venv/bin/python -m benchmarks.vision.image_text --data /tmp/demo --scale 1.0

The machine is shared: compare the two placements within one run; the notes say how much CPU
everything else used while each deployment was timed.
"""
from __future__ import annotations

import time

from benchmarks.common.benchlib import (
    MiB,
    add_corpus_args,
    add_mesh_args,
    argument_parser,
    log,
    print_header,
    workspace,
)
from benchmarks.vision.deployment import DEPLOYMENT_SOURCES, Deployment, deployment_config, run_deployment
from benchmarks.vision.transforms import (
    IMAGE_SOURCES,
    LARGE_SIDE,
    PLACEMENTS,
    SMALL_PIXELS,
    TEXT_SOURCES,
    KindRow,
    RowGroupRow,
    run_transforms,
)

MB = 1e6


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
