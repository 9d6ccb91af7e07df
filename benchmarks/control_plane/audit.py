"""`overlord audit` of a stopped run: one pass over the plan journal vs a lookup per step.

A real run first (`LocalCluster` over the demo corpus, every rank through a TrainerClient for --steps
steps, a Planner snapshot every --every steps), stopped. Then its offline audit, twice in the same
process, side by side:

- per step (the audit until now): the plan of every step read back with `Planner.journaled(step)`:
  the latest snapshot at or before the step read, the journal read from its offset up to the step
  (up to `checkpoint.every` records), then the step re-derived: O(steps x checkpoint.every) records read;
- one pass (now): `Replayer.in_force()`: the journal read once from its start, each step re-derived
  from the state the record before it left, the run's input files (configs, rewinds) parsed once.

Both re-derive every step and check it against its journaled digest, and the script checks that the
two audits are the same report. Wall and CPU seconds of each, per step and in all.

    .venv/bin/python -m benchmarks.control_plane.audit  # 300 steps, a snapshot every 50
    .venv/bin/python -m benchmarks.control_plane.audit --steps 600 --every 200 --data data/demo --keep runs/audit
"""
from __future__ import annotations

import time
from pathlib import Path

from benchmarks.common.benchlib import add_corpus_args, argument_parser, log, print_header, workspace, write_config
from flight_overlord import harness
from flight_overlord.constructor.deliveries import read_deliveries
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.journal import read_journal
from flight_overlord.planner.audit import audit_run, compute_audit, offline_planner

SOURCES = ["captions", "code", "docstrings", "qa"]


def per_step_audit(run_dir: Path, config: Path) -> dict:
    """The audit as it was made before: each step's plan looked up alone (``Planner.journaled``)."""
    with offline_planner(run_dir, str(config)) as planner:
        starts, records, rewinds = read_deliveries(run_dir)
        edits = [r.get("edit") or {"kind": "mix", **r["mix"]} for _, r in read_journal(run_dir / "plan-journal.jsonl")
                 if "edit" in r or "mix" in r]
        plans = (p for step in range(planner.next_step) if (p := planner.journaled(step)) is not None)
        return compute_audit(starts, records, plans, edits, rewinds)


def one_pass_audit(run_dir: Path, config: Path) -> dict:
    with offline_planner(run_dir, str(config)) as planner:
        return audit_run(run_dir, planner)


def timed(fn) -> tuple[dict, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    p = argument_parser(__doc__)
    add_corpus_args(p, scale=0.05)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--every", type=int, default=50, help="checkpoint.every: steps between Planner snapshots")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--keep", type=Path, help="write the run (run.yaml, run/) here and keep it, for `overlord audit`")
    args = p.parse_args()
    print_header()
    with workspace("bench_audit-", args.data, SOURCES, args.scale) as (tmp, data_dir):
        base = args.keep.resolve() if args.keep is not None else tmp
        base.mkdir(parents=True, exist_ok=True)
        run_dir = base / "run"
        config = write_config(base / "run.yaml", data_dir, [{"name": n} for n in SOURCES], ranks=args.ranks,
                              context_length=1024, microbatches=2, tokens_per_step=1800 * args.ranks, seed=0,
                              run_dir=run_dir, checkpoint={"every": args.every})
        log(f"run: {args.steps} steps, {args.ranks} ranks, a snapshot every {args.every}")
        started = time.monotonic()
        with LocalCluster(config) as cluster:
            harness.train(cluster.planner, args.ranks, 0, args.steps)
        log(f"run done in {time.monotonic() - started:.0f}s")
        now, now_wall, now_cpu = timed(lambda: one_pass_audit(run_dir, config))
        before, before_wall, before_cpu = timed(lambda: per_step_audit(run_dir, config))
        if now != before:
            raise SystemExit("the one-pass audit differs from the per-step one")
        planned = now["through_step"] + 1
        print(f"\nrun: {planned} steps audited, {now['samples']:,} samples, duplicates {now['duplicates']}, "
              f"missing {now['missing']}; checkpoint.every {args.every}")
        print("\n| audit | wall | CPU | CPU per step |")
        print("|---|---:|---:|---:|")
        for name, wall, cpu in (("per step (before)", before_wall, before_cpu), ("one pass (now)", now_wall, now_cpu)):
            print(f"| {name} | {wall:.2f} s | {cpu:.2f} s | {1e3 * cpu / planned:.1f} ms |")
        print(f"\none pass / per step: wall {now_wall / before_wall:.2f}x, CPU {now_cpu / before_cpu:.2f}x "
              f"(same report)")


if __name__ == "__main__":
    main()
