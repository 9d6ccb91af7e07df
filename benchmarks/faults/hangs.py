"""Hangs: one role's process gets SIGSTOP for --hang seconds when rank 0 reaches step --at of --steps,
while the trainers consume at a steady simulated step time; every rank's stream is compared with an
undisturbed run's. The kill -9 version of the same runs is ``benchmarks.faults.kill_and_resume`` (part 1,
``benchmarks.faults.kill_runs``, whose machinery this reuses).

Per hung role and setting it prints the worst gap between two consecutive batches of a rank (step time
included) among those ending after the stop, against the run's median gap, and how long after the
stop the hung process was replaced. With liveness on (this package's default, ``liveness:
{probe_seconds: 0.2, hung_seconds: 1.0}``) a hung role is killed and replaced; the baseline runs the
same with ``liveness: {hung_seconds: 0}``, which is the behaviour before liveness: nothing takes over
from a process that does not refuse connections, so everyone waits for the SIGCONT.

    .venv/bin/python -m benchmarks.faults.hangs  # 30 s stops at step 15 of 60, 50 ms steps
    .venv/bin/python -m benchmarks.faults.hangs --hang 8 --no-baseline --kinds constructor
"""
from __future__ import annotations

import os
import signal
import threading

from benchmarks.common.benchlib import add_corpus_args, argument_parser, log, print_header, workspace
from benchmarks.faults.kill_runs import SOURCES, compare, fmt_s, part1_config, run_part1, watch_recovery

KINDS = ("loader", "loader+shadow", "planner+standby", "constructor")
GOAL_SECONDS = {"loader": 5.0, "loader+shadow": 3.0, "planner+standby": 3.0, "constructor": 3.0}  # issue 31


def stop_for(seconds: float):
    """A ``run_part1`` strike: SIGSTOP of the role's process, SIGCONT ``seconds`` later if it still lives;
    the fault's times are filled in as the role is replaced (if it is, within the stop)."""
    def strike(cluster, role, fault, done) -> None:
        child = cluster.child(role)
        before, process = len(child.restarts), child.process
        os.kill(process.pid, signal.SIGSTOP)

        def resume() -> None:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
        timer = threading.Timer(seconds, resume)
        timer.daemon = True
        timer.start()
        watch_recovery(cluster, child, before, fault, done, timeout=seconds + 5)
    return strike


def run_kind(tmp, data_dir, args, kind: str, *, liveness: bool):
    name = f"{kind.replace('+', '-')}-{'live' if liveness else 'off'}"
    config = part1_config(tmp, data_dir, name, args, prefetch=args.prefetch, shadows=int(kind == "loader+shadow"),
                          standbys=int(kind == "planner+standby"),
                          **({} if liveness else {"liveness": {"hung_seconds": 0}}))
    log(f"SIGSTOP {kind} for {args.hang:g}s at step {args.at[0]}, liveness {'on' if liveness else 'off'}")
    return run_part1(config, name, args, prefetch=args.prefetch, kind=kind, strike=stop_for(args.hang))


def report(reference, runs: dict, args) -> None:
    print(f"\n## SIGSTOP of one role for {args.hang:g} s at step {args.at[0]} of {args.steps}\n")
    print(f"Trainers: {args.ranks} ranks, TrainerClient prefetch {args.prefetch}, {args.step_time * 1000:.0f} ms of "
          f"simulated compute per step. Config: 6 demo sources, one process per loader actor; loader stops hit "
          f"loader-{args.loader_source}-0, constructor stops constructor-0. gap = the longest interval between a "
          f"rank's consecutive batches ending after the stop; x median = over the run's median interval. replaced = "
          f"stop -> the supervisor (or the standby) started the replacement; serving = stop -> it answered a call.\n")
    print("| hung role | setting | liveness | worst gap s | x median step | median step ms | replaced s | serving s "
          "| steps lost | goal |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    problems = []
    for (kind, live), run in runs.items():
        settings = {"loader+shadow": "`loader.shadows: 1`", "planner+standby": "`planner.standbys: 1`"}
        setting = settings.get(kind, "default")
        median = run.median_interval() if run.intervals() else float("nan")
        fault = run.faults[0] if run.faults else None
        gap = fault.max_interval if fault else float("nan")
        lost, notes = compare(run, reference)
        replaced = None if fault is None or fault.t_restart is None else fault.t_restart - fault.t_kill
        goal = f"{'met' if gap <= GOAL_SECONDS[kind] else 'MISSED'} (<= {GOAL_SECONDS[kind]:g} s)" if live else "-"
        print(f"| {kind.split('+')[0]} | {setting} | {'on' if live else 'off'} | {gap:.2f} | {gap / median:.0f}x "
              f"| {median * 1000:.0f} | {fmt_s(replaced)} | {fmt_s(fault.recovery if fault else None)} | {lost} "
              f"| {goal} |")
        if run.error:
            problems.append(f"{kind}, liveness {live}: trainer error: {run.error}")
        if lost:
            problems.append(f"{kind}, liveness {live}: {lost} steps lost:\n    " + "\n    ".join(notes[:20]))
        if goal.startswith("MISSED"):
            problems.append(f"{kind}: worst gap {gap:.2f} s over the {GOAL_SECONDS[kind]:g} s goal")
    if reference.error:
        problems.append(f"undisturbed run: {reference.error}")
    print(f"\n- undisturbed run: median interval {reference.median_interval() * 1000:.0f} ms, worst "
          f"{reference.max_interval():.2f} s; start-up {reference.startup:.1f} s")
    print("- problems: " + ("none" if not problems else "\n  - " + "\n  - ".join(problems)))


def parse_args(argv=None):
    p = argument_parser(__doc__)
    p.add_argument("--hang", type=float, default=30.0, help="seconds of SIGSTOP (default 30)")
    p.add_argument("--at", type=int, nargs=1, default=[15], help="rank 0's step at the stop (default 15)")
    p.add_argument("--steps", type=int, default=60, help="steps per run (default 60)")
    p.add_argument("--step-time", type=float, default=0.05, help="simulated seconds per step (default 0.05)")
    p.add_argument("--prefetch", type=int, default=2, help="TrainerClient and config prefetch (default 2)")
    p.add_argument("--ranks", type=int, default=2, help="data-parallel trainer ranks (default 2)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS, help="which roles hang")
    p.add_argument("--no-baseline", action="store_true", help="skip the runs with liveness off")
    p.add_argument("--loader-source", default="longdocs", choices=sorted(SOURCES), help="whose loader hangs")
    p.add_argument("--checkpoint-every", type=int, default=25, help="checkpoint.every (default 25)")
    add_corpus_args(p, scale=0.3)
    args = p.parse_args(argv)
    if not 0 < args.at[0] < args.steps or args.hang <= 0:
        p.error("--at must be inside --steps, --hang > 0")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    print_header()
    with workspace("bench-hangs-", args.data, list(SOURCES), args.scale) as (tmp, data_dir):
        log("undisturbed run")
        reference = run_part1(part1_config(tmp, data_dir, "undisturbed", args, prefetch=args.prefetch, shadows=0),
                              "undisturbed", args, prefetch=args.prefetch)
        runs = {}
        for kind in args.kinds:
            for live in (True,) if args.no_baseline else (True, False):
                runs[(kind, live)] = run_kind(tmp, data_dir, args, kind, liveness=live)
        report(reference, runs, args)


if __name__ == "__main__":
    main()
