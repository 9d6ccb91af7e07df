"""Fault tolerance: what a kill -9 of each role costs the trainers, what a full-cluster resume costs,
and what shadow loaders and checkpointing cost.

Three parts, on one demo corpus (``make_demo_data(seed=0, scale=--scale)``), every role a process of
a supervised ``LocalCluster`` on this machine:

1. kill -9 per role  for each failure kind (a loader without a shadow, a loader with one shadow,
                     the Planner, a constructor) and each --prefetch value: one run of --steps steps
                     on --ranks trainer ranks (a thread each, ``TrainerClient``, prefetch = the config's
                     ``prefetch``) that consume every step at a steady simulated step time
                     (--step-time, 50 ms: the trainer sleeps so that each step takes that long after
                     its batch arrived, which gives prefetch something to hide the fault behind).
                     When rank 0 reaches step --kill-every, 2x, ... the role gets SIGKILL (the next
                     kill waits until the role serves again). Per fault:
                     - stall: the longest interval between a rank's consecutive batches (as the
                       trainer sees them, step time included) among those ending between this kill
                       and the next, against the median interval of the run (~ the step time);
                     - recovery: kill -> the supervisor restarted it (``Child.restarts``) -> its ready
                       file (mtime) -> the first ``status`` call that succeeds on a fresh connection;
                     - steps lost: every rank's stream (sample keys per microbatch and a hash of the
                       token ids, per step) against an undisturbed run of the same config; must be 0.
                     The loader kills hit ``loader-<--loader-source>-0`` (part 1 runs ``loader.hosts:
                     0``, one process per loader actor); constructor kills alternate
                     between the constructors.
2. resume            one run driven as fast as it goes (a ``StepFetcher`` thread per rank, a tiny
                     config: 1 microbatch of 512 tokens per rank) to step N for each --resume-at N;
                     there the whole cluster gets SIGKILL at once and restarts with
                     ``mode="resume"`` (--resume-reps times): time from ``LocalCluster(...)`` to
                     ``start()`` returning (start-up: processes, imports, registration) and to the
                     first batch of step N on every rank (``TrainerClient.load_state_dict``). The
                     state restore itself (latest snapshot + journal tail, the Planner's and every
                     loader's) is also timed in this process, from the files, between kill and
                     resume. The drive is unsupervised (a full-cluster kill must not be restarted).
3. costs             shadows: PSS (psutil ``memory_full_info().pss``, max over samples every 1 s) and
                     CPU time of the loader processes in the undisturbed runs of part 1 with
                     ``loader.shadows`` 0 and 1 (same steps). Checkpointing: bytes in run_dir after
                     those runs (and after part 2's run), split into the plan journal, Planner
                     snapshots, loader journals and loader snapshots (nothing is ever rewritten or
                     pruned, so file sizes are bytes written), per step.

    .venv/bin/python -m benchmarks.faults.kill_and_resume  # defaults: ~3-4 min on 2 cores
    .venv/bin/python -m benchmarks.faults.kill_and_resume --parts 1 --kinds planner --prefetch 2 4 8
    .venv/bin/python -m benchmarks.faults.kill_and_resume --parts 2 --resume-at 50 500 5000 20000

Timings are wall-clock on a possibly shared machine: the header gives the load average; no timing
is asserted. Steps lost are checked and any mismatch is printed.
"""
from __future__ import annotations

from benchmarks.common.benchlib import MiB, add_corpus_args, argument_parser, print_header, workspace
from benchmarks.faults.kill_runs import KINDS, SOURCES, kill_targets, part1, report_part1
from benchmarks.faults.resume_runs import part2, report_part2

# ---------------------------------------------------------------------------------------------
# Part 3: the cost of shadows and of checkpointing
# ---------------------------------------------------------------------------------------------

def report_part3(references: dict, args, part2_bytes: dict | None) -> None:
    print("\n## Part 3: what shadows and checkpointing cost\n")
    prefetch = args.prefetch[0]
    runs = {s: references[(prefetch, s)] for s in (0, 1) if (prefetch, s) in references}
    print(f"Shadows: the loader processes of the undisturbed part-1 runs (prefetch {prefetch}, {args.steps} steps, "
          f"{args.ranks} ranks, {args.step_time * 1000:.0f} ms per step), PSS sampled every 1 s (max of the sum), "
          "CPU from psutil: while the trainers consumed, and in all (start-up included).\n")
    print("| loader.shadows | loader processes | PSS MiB (sum, at max) | per process MiB | CPU s while consuming "
          "| CPU s in all | CPU ms per step (in all) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = None
    for shadows, run in runs.items():
        info = run.loaders or {}
        n = info.get("processes", 0)
        pss = info.get("max_pss", 0) / MiB
        cpu_window = sum(info.get("cpu_window", {}).values())
        cpu_total = sum(info.get("cpu_total", {}).values())
        split = "; ".join(f"{label} {k}x {p / MiB:.0f}" for label, (k, p) in sorted(info.get("by_label", {}).items()))
        print(f"| {shadows} | {n} | {pss:.0f} ({split}) | {pss / max(1, n):.0f} | {cpu_window:.2f} | {cpu_total:.2f} "
              f"| {cpu_total / run.steps * 1000:.1f} |")
        if shadows == 0:
            base = (pss, cpu_window, cpu_total)
        elif base:
            print(f"\n- one shadow per loader: x{pss / base[0]:.2f} loader PSS, x{cpu_window / max(1e-9, base[1]):.2f} "
                  f"loader CPU while consuming, x{cpu_total / max(1e-9, base[2]):.2f} in all\n")
    print(f"Checkpointing (checkpoint.every {args.checkpoint_every}): bytes in run_dir after a run; nothing is "
          "rewritten or pruned, so these are the bytes written. Per step = / steps journaled by the Planner "
          "(it plans prefetch steps ahead of the trainers).\n")
    print("| run | steps journaled | plan journal | Planner snapshots | loader journals | loader snapshots "
          "| total | bytes per step |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = [(f"part 1, shadows {s}, {references[(prefetch, s)].steps} steps", references[(prefetch, s)].run_dir_bytes)
            for s in runs]
    if part2_bytes:
        rows.append((f"part 2 (tiny steps, to {max(args.resume_at):,}, {len(args.resume_at) * args.resume_reps} "
                     "resumes)", part2_bytes))
    for name, b in rows:
        steps = max(1, b["journaled_steps"])
        kinds = ("plan journal", "Planner snapshots", "loader journals", "loader snapshots")
        total = sum(b[k] for k in kinds)
        cells = [f"{b['plan journal'] / 1e3:,.1f} KB",
                 f"{b['Planner snapshots'] / 1e3:,.1f} KB ({b['planner_snapshot_files']} files)",
                 f"{b['loader journals'] / 1e3:,.1f} KB",
                 f"{b['loader snapshots'] / 1e3:,.1f} KB ({b['loader_snapshot_files']} files)"]
        print(f"| {name} | {b['journaled_steps']:,} | {' | '.join(cells)} | {total / 1e3:,.1f} KB "
              f"| {total / steps:,.0f} ({', '.join(f'{b[k] / steps:,.0f}' for k in kinds)}) |")


# ---------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argument_parser(__doc__)
    p.add_argument("--parts", type=int, nargs="+", default=[1, 2, 3], choices=[1, 2, 3])
    p.add_argument("--ranks", type=int, default=2, help="data-parallel trainer ranks (default 2)")
    p.add_argument("--steps", type=int, default=75, help="part 1: steps per run (default 75)")
    p.add_argument("--kill-every", type=int, default=15, help="part 1: kill -9 every this many steps (default 15)")
    p.add_argument("--step-time", type=float, default=0.05, help="part 1: simulated seconds per step (default 0.05)")
    p.add_argument("--prefetch", type=int, nargs="+", default=[2, 4], help="part 1: prefetch values (default 2 4)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS, help="part 1: failure kinds")
    p.add_argument("--loader-source", default="longdocs", choices=sorted(SOURCES), help="part 1: whose loader dies")
    p.add_argument("--checkpoint-every", type=int, default=25, help="checkpoint.every (default 25)")
    p.add_argument("--resume-at", type=int, nargs="+", default=[50, 500, 5000], help="part 2: N (default 50 500 5000)")
    p.add_argument("--resume-reps", type=int, default=3, help="part 2: resumes per N (default 3)")
    add_corpus_args(p, scale=0.3)
    args = p.parse_args(argv)
    if min(args.ranks, args.steps, args.kill_every, args.resume_reps, *args.prefetch, *args.resume_at) < 1:
        p.error("--ranks, --steps, --kill-every, --resume-reps, --prefetch and --resume-at must be >= 1")
    if 1 in args.parts and not kill_targets(args):
        p.error("--kill-every leaves no kill before the last --kill-every steps of --steps")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    print_header()
    with workspace("bench-faults-", args.data, list(SOURCES), args.scale) as (tmp, data_dir):
        references, faults, part2_results, part2_bytes = {}, {}, [], None
        if 1 in args.parts or 3 in args.parts:
            references, faults = part1(tmp, data_dir, args)
        if 2 in args.parts:
            part2_results, part2_bytes, seconds_per_step = part2(tmp, data_dir, args)
        if 1 in args.parts:
            report_part1(references, faults, args)
        if 2 in args.parts:
            report_part2(part2_results, args, seconds_per_step)
        if 3 in args.parts:
            report_part3(references, args, part2_bytes)


if __name__ == "__main__":
    main()
