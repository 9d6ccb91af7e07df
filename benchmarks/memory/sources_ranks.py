"""Memory of flight_overlord vs the colocated DataLoader as sources and ranks grow, measured, then modelled at
512 nodes.

Measured: the PSS summed over every process of each side (psutil ``memory_full_info().pss``,
children included), sampled every 0.5 s while the ranks run their timed steps; the max and the
last sample (all processes still up) are reported. Same corpus, same steps on both sides:

  flight_overlord  ``LocalCluster`` (Planner, loader hosts, one Data Constructor per rank) plus
                   one trainer process per rank iterating ``TrainerClient`` (benchmarks.delivery.throughput's
                   ``overlord_trainer``); ``loader: {hosts: auto}`` (the default: min(loader
                   actors, CPUs) processes; ``--hosts N``), and ``hosts: 0`` (one process per
                   loader actor) as well at the smallest source count.
  colocated        benchmarks.delivery.throughput's baseline: a torch DataLoader per rank with ``--workers``
                   workers, every worker opening every file of every source.

The corpus is ``make_many_sources`` (``overlord make-demo-data --sources N``): the largest source
count is generated once and each run uses its first S sources, equal token-share weights.

Then the paper's dry-run method (section 7.4, Fig. 14): from the measured per-component memory
(colocated: per rank, per worker, per worker and source; flight_overlord: per loader host, per
source, per constructor) a MODEL of 512 nodes x 8 GPUs, batch 512, 4 workers, over TP/CP/PP:
colocated loading is repeated on every GPU rank, flight_overlord loads once and builds once per
data-parallel group. Written as a table and as ``docs/memory_ratio.png`` (needs matplotlib).

Each flight_overlord cell runs two loader variants: ``default`` (the config's read-ahead: 2 row groups, at
most 4 MiB) and ``lean`` (``loader.read_ahead_bytes: 1``: nothing read ahead of the Planner's demand). A
"data path only" table subtracts R bare trainer processes (measured together in the same run)
from both sides: an estimate, labelled as such; the headline is the total PSS.

    .venv/bin/python -m benchmarks.memory.sources_ranks  # defaults: ~1.5 min on 2 quiet cores
    .venv/bin/python -m benchmarks.memory.sources_ranks --grid full  # S x R all combinations (within --max-gib)
    .venv/bin/python -m benchmarks.memory.sources_ranks --sources 6,24 --ranks 2 --no-plot
    .venv/bin/python -m benchmarks.memory.sources_ranks --row-group-mib 2 --sources 96 --ranks 2  # realistic row groups
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.common.benchlib import (
    REPO,
    MiB,
    add_run_args,
    argument_parser,
    log,
    print_header,
    pyplot,
    save_plot,
    workspace,
)
from benchmarks.memory.runs import (
    GiB,
    Run,
    bare_trainers_pss,
    ensure_many,
    fitted_colocated,
    run_colocated,
    run_overlord,
    sized_corpus,
)

# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def gib(b: float) -> str:
    return f"{b / GiB:.2f}"


def _find(runs: list[Run], side: str, s: int, r: int, hosts=None, variant: str = "") -> Run | None:
    return next((x for x in runs if x.side == side and (x.sources, x.ranks) == (s, r) and x.variant == variant
                 and (side == "colocated" or x.hosts == hosts)), None)


def measured_table(runs: list[Run], args, bare: dict[int, int]) -> None:
    print("\n### Measured PSS (GiB, summed over every process of the side, max while running)\n")
    print(f"W = {args.workers} DataLoader workers per rank (colocated); {args.microbatches} microbatches of "
          f"{args.context_length} tokens per rank and step, {args.warmup} warm-up + {args.steps} timed steps. "
          f"overlord: `loader.hosts: {args.hosts}`; *default* reads 2 row groups ahead while "
          f"an actor holds under 4 MiB (`read_ahead_row_groups: 2`, `read_ahead_bytes: 4 MiB`), *lean* reads only "
          f"what the Planner asks for (`read_ahead_bytes: 1`).\n")
    print("| S | R | colocated | overlord default | colocated / default | overlord lean | colocated / lean "
          "| overlord hosts:0 | colocated end | lean end |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    keys = sorted({(r.sources, r.ranks) for r in runs})
    cell = lambda x, a="max_pss": (x.error or gib(getattr(x, a))) if x else "-"  # noqa: E731
    ratio = lambda c, o: f"**{c.max_pss / o.max_pss:.2f}x**" if c and o and not (c.error or o.error) else "-"  # noqa: E731
    for s, r in keys:
        c = _find(runs, "colocated", s, r)
        o = _find(runs, "overlord", s, r, args.hosts, "default")
        lean = _find(runs, "overlord", s, r, args.hosts, "lean")
        o0 = _find(runs, "overlord", s, r, 0, "default")
        print(f"| {s} | {r} | {cell(c)} | {cell(o)} | {ratio(c, o)} | {cell(lean)} | {ratio(c, lean)} | {cell(o0)} "
              f"| {cell(c, 'end_pss')} | {cell(lean, 'end_pss')} |")
    print(f"\n**Data path only** (NOT the headline: each side minus the summed PSS of R bare trainer processes "
          f"run together in this run, Python with torch, numpy, pyarrow and flight_overlord's client imported and "
          f"no data ({', '.join(f'R={r}: {b / MiB:.0f} MiB' for r, b in bare.items())}); what is left is roughly what "
          f"loading the data costs on each side. PSS splits shared pages across every process of the machine, so "
          f"this is an estimate):\n")
    print("| S | R | bare trainers | colocated - bare | overlord default - bare | ratio | overlord lean - bare "
          "| ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s, r in keys:
        c = _find(runs, "colocated", s, r)
        b = bare.get(r, 0)
        row = [f"| {s} | {r} | {gib(b)} | " + (gib(c.max_pss - b) if c and not c.error else "-")]
        for o in (_find(runs, "overlord", s, r, args.hosts, variant) for variant in ("default", "lean")):
            ok = o and not o.error and c and not c.error
            row.append(gib(o.max_pss - b) if o and not o.error else "-")
            row.append(f"{(c.max_pss - b) / (o.max_pss - b):.2f}x" if ok else "-")
        print(" | ".join(row) + " |")
    print("\nEvery flight_overlord run (the read-ahead sweep: `--variants ra1,ra2,ra4,bytes4m,...`):\n")
    print("| S | R | variant | total PSS (GiB) | loader hosts (MiB) | constructors (MiB) | samples/s |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for x in runs:
        if x.side == "overlord" and not x.error:
            print(f"| {x.sources} | {x.ranks} | {x.variant} | {gib(x.max_pss)} | {x.label_sum('loader') / MiB:.0f} "
                  f"| {x.label_sum('constructor') / MiB:.0f} | {x.samples_per_s:.0f} |")
    print("\nPSS by process kind at the max (MiB, processes x total):\n")
    for x in runs:
        if not x.error:
            kinds = ", ".join(f"{k} {n}x {p / MiB:.0f}" for k, (n, p) in x.by_label.items())
            print(f"- {x.side} S={x.sources} R={x.ranks}"
                  + (f" hosts={x.hosts} {x.variant}" if x.side == "overlord" else "")
                  + f": {kinds}; {x.batches_per_s:.1f} microbatches/s; up in {x.start_s:.1f}s")


def slope(runs: list[Run], side: str, ranks: int, hosts: int | None, value,
          variant: str = "default") -> tuple[float, float] | None:
    """(slope per source, intercept) of ``value(run)`` over the source counts at ``ranks``."""
    pts = [(x.sources, value(x)) for x in runs if x.side == side and x.ranks == ranks and x.hosts == hosts
           and x.variant in ("", variant) and not x.error]
    if len({s for s, _ in pts}) < 2:
        return None
    a, b = np.polyfit([s for s, _ in pts], [v for _, v in pts], 1)
    return float(a), float(b)


@dataclass
class Components:
    """Per-component memory (bytes) the model is built from."""
    col_worker: float       # one DataLoader worker without sources
    col_worker_source: float  # one worker, per source it opens
    col_rank_extra: float   # what a colocated rank process holds beyond a trainer process (>= 0)
    host_base: float        # one loader host process without sources
    loader_source: float    # per source, on the loader side
    constructor: float      # one Data Constructor (at the measured S; its per-source part separately)
    constructor_source: float
    planner: float
    planner_source: float


def components(runs: list[Run], args) -> Components | None:
    r = min(x.ranks for x in runs)
    col = slope(runs, "colocated", r, None,
                lambda x: x.label_sum("worker") / max(1, x.by_label.get("worker", (1, 0))[0]))
    v = args.model_variant
    load = slope(runs, "overlord", r, args.hosts, lambda x: x.label_sum("loader"), v)
    cons = slope(runs, "overlord", r, args.hosts, lambda x: x.label_avg("constructor"), v)
    plan = slope(runs, "overlord", r, args.hosts, lambda x: x.label_avg("planner"), v)
    if not (col and load and cons and plan):
        return None
    smallest = [x for x in runs if x.ranks == r and not x.error]
    s0 = min(x.sources for x in smallest)
    c0 = next(x for x in smallest if x.side == "colocated" and x.sources == s0)
    o0 = next(x for x in smallest if x.side == "overlord" and x.hosts == args.hosts and x.sources == s0
              and x.variant == v)
    return Components(col_worker=max(col[1], 0.0), col_worker_source=max(col[0], 0.0),
                      col_rank_extra=max(c0.label_avg("rank") - o0.label_avg("trainer"), 0.0),
                      host_base=max(load[1], 0.0) / max(1, o0.by_label.get("loader", (1, 0))[0]),
                      loader_source=max(load[0], 0.0),
                      constructor=max(cons[1], 0.0), constructor_source=max(cons[0], 0.0),
                      planner=max(plan[1], 0.0), planner_source=max(plan[0], 0.0))


def simulate(c: Components, *, nodes: int, gpus: int, batch: int, workers: int, sources: int,
             context_length: int, tp: int, cp: int, pp: int, hosts: int, prefetch: int = 2) -> tuple[float, float]:
    """(colocated bytes, flight_overlord bytes) of data loading on the whole cluster: a MODEL.

    Colocated: every GPU rank (TP/CP/PP peers included) runs the DataLoader: rank extra + workers x
    (worker + sources x per-source). flight_overlord: the Planner, ``hosts`` loader hosts and every
    source once (no source partitioning), and one constructor per data-parallel group, whose step
    buffers hold its share of the global batch (batch / DP sequences of ``context_length`` tokens, 17
    bytes per token over the microbatch columns, ``prefetch`` steps). Trainer processes themselves are
    on both sides and left out."""
    world = nodes * gpus
    dp = max(1, world // (tp * cp * pp))
    colocated = world * (c.col_rank_extra + workers * (c.col_worker + sources * c.col_worker_source))
    buffer = prefetch * math.ceil(batch / dp) * context_length * 17
    constructor = c.constructor + sources * c.constructor_source + buffer
    overlord = (c.planner + sources * c.planner_source + hosts * c.host_base + sources * c.loader_source
                + dp * constructor)
    return colocated, overlord


def simulation(c: Components, args) -> list[tuple[int, int, int, int, float, float, float]]:
    print("\n### Simulated (a MODEL built from the measured components, not a measurement)\n")
    print(f"Paper section 7.4 dry-run setting: {args.sim_nodes} nodes x {args.sim_gpus} GPUs, global batch "
          f"{args.sim_batch} sequences of {args.sim_context} tokens, {args.workers} workers per rank, "
          f"{args.sim_sources} sources, no source partitioning, {args.sim_hosts} loader hosts; overlord components "
          f"from its {args.model_variant!r} runs.")
    print(f"Components (MiB): colocated worker {c.col_worker / MiB:.1f} + {c.col_worker_source / MiB:.2f}/source, "
          f"rank extra {c.col_rank_extra / MiB:.1f}; overlord loader host {c.host_base / MiB:.1f}, "
          f"loader {c.loader_source / MiB:.2f}/source, constructor {c.constructor / MiB:.1f} + "
          f"{c.constructor_source / MiB:.2f}/source + step buffers, planner {c.planner / MiB:.1f} + "
          f"{c.planner_source / MiB:.2f}/source\n")
    print("| TP | CP | PP | DP | colocated (TiB) | flight_overlord (GiB) | colocated / overlord |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    levels = [1, 2, 4, 8]
    for tp, cp, pp in itertools.product(levels, levels, levels):
        col, ovl = simulate(c, nodes=args.sim_nodes, gpus=args.sim_gpus, batch=args.sim_batch, workers=args.workers,
                            sources=args.sim_sources, context_length=args.sim_context, tp=tp, cp=cp, pp=pp,
                            hosts=args.sim_hosts)
        dp = max(1, args.sim_nodes * args.sim_gpus // (tp * cp * pp))
        rows.append((tp, cp, pp, dp, col, ovl, col / ovl))
        if tp in (1, 8) or (cp == 1 and pp == 1):
            print(f"| {tp} | {cp} | {pp} | {dp} | {col / 2**40:.2f} | {ovl / GiB:.1f} | {col / ovl:.1f}x |")
    ratios = [r[-1] for r in rows]
    print(f"\n(rows shown: TP 1 and 8 with every CP/PP, and TP 2, 4 at CP=PP=1; all 64 in the plot.) "
          f"Modelled ratio: min {min(ratios):.1f}x, max {max(ratios):.1f}x over TP, CP, PP in {{1, 2, 4, 8}}.")
    return rows


def plot(rows, args, path: Path) -> None:
    plt = pyplot(path)
    if plt is None:
        return
    levels = sorted({r[1] for r in rows})
    fig, axes = plt.subplots(1, len(levels), figsize=(3.2 * len(levels), 3.4), sharey=True)
    for ax, cp in zip(axes, levels):
        for tp in sorted({r[0] for r in rows}):
            pts = sorted((r[2], r[-1]) for r in rows if r[0] == tp and r[1] == cp)
            ax.plot([p for p, _ in pts], [v for _, v in pts], marker="o", label=f"TP={tp}")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.axhline(13.5, color="red", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("PP")
        ax.set_title(f"CP={cp}")
    axes[0].set_ylabel("colocated / flight_overlord memory")
    axes[-1].legend(fontsize=7)
    fig.suptitle(f"MODEL (dry run from measured components): {args.sim_nodes} nodes x {args.sim_gpus} GPUs, "
                 f"batch {args.sim_batch}, {args.workers} workers, {args.sim_sources} sources; red: 13.5x", fontsize=9)
    save_plot(fig, path)


# ---------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argument_parser(__doc__)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p.add_argument("--sources", type=ints, default=[6, 24, 96], help="source counts S (default 6,24,96)")
    p.add_argument("--ranks", type=ints, default=[2, 4, 8], help="rank counts R (default 2,4,8)")
    p.add_argument("--grid", choices=["cross", "full"], default="cross",
                   help="cross (default): every S at the smallest R, every R at the smallest S; full: all S x R")
    p.add_argument("--workers", type=int, default=4, help="colocated DataLoader workers per rank (default 4)")
    p.add_argument("--hosts", type=lambda v: v if v == "auto" else int(v), default="auto",
                   help="flight_overlord loader.hosts: auto (default, the config's default: "
                        "min(ceil(actors / 4), CPUs)) or N")
    p.add_argument("--no-hosts0", action="store_true", help="skip the hosts: 0 run at the smallest S")
    p.add_argument("--max-gib", type=float, default=20.0,
                   help="skip colocated runs the fitted model puts above this (default 20)")
    p.add_argument("--row-group-mib", type=float, default=0.0,
                   help="rewrite each source with row groups of this many MiB of text (2 files x 2 row groups; "
                        "0: the demo corpus's own, ~0.1 MiB)")
    p.add_argument("--variants", type=lambda t: t.split(","), default=["default", "lean"],
                   help="overlord loader variants: default (the config's read-ahead), lean (read_ahead_bytes: 1), "
                        "or a sweep's raN / bytesNm / slNm joined by + (read_ahead_row_groups N, "
                        "read_ahead_bytes N MiB, sample_level_bytes N MiB)")
    p.add_argument("--model-variant", default="lean", help="the overlord variant the simulation is built from")
    p.add_argument("--data", type=Path, help="corpus dir (make_many_sources; generated if missing)")
    add_run_args(p, steps=8, timeout=300.0)
    p.add_argument("--sim-nodes", type=int, default=512)
    p.add_argument("--sim-gpus", type=int, default=8)
    p.add_argument("--sim-batch", type=int, default=512)
    p.add_argument("--sim-context", type=int, default=32768)
    p.add_argument("--sim-sources", type=int, default=100)
    p.add_argument("--sim-hosts", type=int, default=64, help="loader hosts in the model (default 64)")
    p.add_argument("--plot", type=Path, default=REPO / "docs" / "memory_ratio.png")
    p.add_argument("--no-plot", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    print_header()
    s_min, r_min = min(args.sources), min(args.ranks)
    if args.grid == "full":
        cells = list(itertools.product(sorted(args.sources), sorted(args.ranks)))
    else:
        cells = sorted({(s, r_min) for s in args.sources} | {(s_min, r) for r in args.ranks})
    runs: list[Run] = []
    if args.model_variant not in args.variants:
        args.model_variant = args.variants[0]
    with workspace("bench-memory-", args.data, [], 1.0) as (tmp, data_dir):
        all_names = ensure_many(data_dir, max(args.sources), args)
        if args.row_group_mib:
            sized = data_dir.with_name(f"{data_dir.name}-rg{args.row_group_mib:g}mib")
            started = time.monotonic()
            sized_corpus(data_dir, sized, all_names, args.row_group_mib)
            log(f"corpus with {args.row_group_mib:g} MiB row groups in {sized} ({time.monotonic() - started:.0f}s)")
            data_dir = sized
        bare = {r: bare_trainers_pss(r) for r in sorted({r for _, r in cells})}
        log("bare trainer processes: " + ", ".join(f"{r}: {b / MiB:.0f} MiB" for r, b in bare.items()))
        for s, r in cells:
            names = all_names[:s]
            todo = [(args.hosts, v) for v in args.variants]
            todo += [(0, "default")] if s == s_min and r == r_min and not args.no_hosts0 else []
            for hosts, variant in todo:
                try:
                    runs.append(run_overlord(args, tmp, data_dir, names, r, hosts, variant))
                except Exception as exc:  # noqa: BLE001 - reported in the table
                    runs.append(Run("overlord", s, r, hosts, variant, error=f"failed: {type(exc).__name__}"))
                    log(f"overlord S={s} R={r} hosts={hosts} {variant} failed: {exc}")
            fit = fitted_colocated(s, r, args.workers, args.row_group_mib)
            if fit > args.max_gib * GiB:
                runs.append(Run("colocated", s, r, None, error=f"skipped (fit {gib(fit)})"))
                continue
            try:
                runs.append(run_colocated(args, data_dir, names, r))
            except Exception as exc:  # noqa: BLE001
                runs.append(Run("colocated", s, r, None, error=f"failed: {type(exc).__name__}"))
                log(f"colocated S={s} R={r} failed: {exc}")
        print(f"\ncorpus: make_many_sources({max(args.sources)}, seed={args.seed}, rows_per_source="
              f"{args.rows_per_source}) (`overlord make-demo-data --sources {max(args.sources)}`), first S sources used"
              + (f"; rewritten with row groups of {args.row_group_mib:g} MiB of text (2 files x 2 row groups per "
                 f"source)" if args.row_group_mib else "; its own row groups (~0.1 MiB of text)"))
        measured_table(runs, args, bare)
        big = [x for x in runs if x.side == "overlord" and x.sources == max(args.sources) and not x.error]
        if big:
            print(f"\n- time to start flight_overlord at S={max(args.sources)}: "
                  + ", ".join(f"R={x.ranks} hosts={x.hosts} {x.variant}: {x.start_s:.1f}s" for x in big))
        for side, hosts, variant, label in [("overlord", args.hosts, v, f"flight_overlord hosts:{args.hosts} {v}")
                                            for v in args.variants] + [("colocated", None, "", "colocated")]:
            fit = slope(runs, side, r_min, hosts, lambda x: x.max_pss, variant)
            if fit:
                print(f"- memory per source added, {label}, R={r_min}: {fit[0] / MiB:.1f} MiB/source "
                      f"(linear fit of max PSS over S={sorted(args.sources)})")
        c = components(runs, args)
        if c is None:
            print("\n(no simulation: it needs two source counts measured on both sides)")
            return
        rows = simulation(c, args)
        if not args.no_plot:
            plot(rows, args, args.plot)


if __name__ == "__main__":
    main()
