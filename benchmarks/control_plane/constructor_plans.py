#!/usr/bin/env python
"""The Planner's constructor plans of a planned step (``planner/constructor_plans.py``): what every
constructor receives, as dp grows.

Over ``control_plane.plan_time.synthetic_planner``'s steps (72 samples per rank, six sources), after one untimed
step, the mean CPU time of this thread (steadier than wall time on a shared machine) of: every
constructor's plan of a fresh step (what the planning loop makes once per step), and one
constructor's plan of the same step read back from its journal record (a restarted Planner serving
it again). With ``--compare-with DIR`` the same in the ``flight_overlord`` package under DIR, in
alternating processes, with a digest of the plans' bytes (equal: the same plans).

    .venv/bin/python -m benchmarks.control_plane.constructor_plans              # this tree, dp 64 .. 4096
    git archive 16b2e8e flight_overlord | tar -x -C /tmp/before
    .venv/bin/python -m benchmarks.control_plane.constructor_plans --compare-with /tmp/before
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common.benchlib import REPO, argument_parser, module_command


def one_run(dp: int, steps: int) -> None:
    """Child: the mean times and a digest of every constructor plan made, as one JSON line."""
    from benchmarks.control_plane.plan_time import synthetic_planner
    from flight_overlord.planner.program import plan_step
    from flight_overlord.planner.step_plan import StepPlan
    try:
        from flight_overlord.planner.roster import Roster
    except ImportError:  # a tree from before the roster's name
        from flight_overlord.planner.registry import Registry as Roster
    try:
        from flight_overlord.planner.constructor_plans import constructor_plans
        builders = None
    except ImportError:  # a tree from before the constructor plan's name: planner/views.py
        from flight_overlord.planner import views as builders
        constructor_plans = builders.step_views

    feeds, mixer, strategy, weights = synthetic_planner(dp)
    mesh = strategy.mesh
    roster = Roster(strategy.cfg, mesh.num_constructors)
    for source, feed in feeds.items():
        roster.register_loader(source, 0, 0, "grpc://127.0.0.1:9",
                                 [[rg.file, rg.row_group, rg.num_rows] for rg in feed.row_groups])

    def one_plan(plan, c):
        if hasattr(builders, "wire_view"):  # a tree with two builders
            return builders.wire_view(plan, c, mesh, roster, frozenset())
        return constructor_plans(plan, mesh, roster, frozenset(), [c])[0]

    digest, every, alone = hashlib.sha256(), 0.0, 0.0
    for step in range(steps + 1):
        plan = plan_step(step, feeds, mixer, strategy, weights)
        journaled = StepPlan.from_record(plan.to_record())
        start = time.thread_time()
        made = constructor_plans(plan, mesh, roster, frozenset())
        middle = time.thread_time()
        again = one_plan(journaled, mesh.num_constructors // 2)
        end = time.thread_time()
        if step:
            every, alone = every + middle - start, alone + end - middle
        for encoded in [*made, again]:
            digest.update(encoded.header)
            digest.update(encoded.rows.serialize())
    print(json.dumps({"every_s": every / steps, "one_s": alone / steps, "constructors": mesh.num_constructors,
                      "digest": digest.hexdigest()[:16]}))


def run_in(root: Path, dp: int, steps: int) -> dict:
    """A child in ``root``: its flight_overlord is first on the child's path, the benchmark code is this tree's."""
    out = subprocess.run([*module_command(__spec__.name), "--one", str(dp), str(steps)], cwd=root, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        return one_run(int(sys.argv[2]), int(sys.argv[3]))
    p = argument_parser(__doc__)
    p.add_argument("--dp", type=int, nargs="+", default=[64, 1024, 4096])
    p.add_argument("--steps", type=int, default=3, help="timed steps per run, after an untimed one (default 3)")
    p.add_argument("--compare-with", type=Path, default=None, help="a directory holding another flight_overlord")
    args = p.parse_args()
    trees = [("now", REPO)] if args.compare_with is None else [("before", args.compare_with.resolve()), ("now", REPO)]
    print("| dp | constructors | tree | every constructor plan of a step, CPU ms | one constructor plan from the "
          "journal, CPU ms | digest |")
    print("|---:|---:|---|---:|---:|---|")
    for dp in args.dp:
        for name, root in trees:
            r = run_in(root, dp, args.steps)
            print(f"| {dp} | {r['constructors']} | {name} | {1000 * r['every_s']:.1f} | {1000 * r['one_s']:.1f} | "
                  f"{r['digest']} |", flush=True)


if __name__ == "__main__":
    main()
