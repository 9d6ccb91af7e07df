"""The plan journal per step as the cluster grows: whole plans (before) vs inputs + state + digest (now).

In process, no servers: a real ``Planner`` (journal, snapshots, fsync) over benchmarks/control_plane/plan_time.py's
synthetic long-document sources (six sources, 72 samples per rank, 32k context, greedy), at each
dp in --dp. For every planned step, side by side in the same run:

- before: the record journals held until now, the whole plan (``StepPlan.to_record()``: every
  sample's key, epoch and sizes, in its bin) plus the state after the step; its JSON bytes and the
  CPU to make it (``to_record`` + JSON);
- now: the bytes the Planner really appended to ``plan-journal.jsonl`` for the step (its inputs,
  the state after it, a digest of the plan) and the CPU to make it (``step_record``, which digests
  the plan's columns);
- the other choice for re-deriving offline, journaling each row group's metadata once (its token
  counts, as JSON): amortised per step, the token counts of the samples the step drew (every row
  is drawn once per epoch), next to the record, which reads them from the files instead;
- replay: a second Planner restored from the run_dir (as after a restart, nothing in memory) serves
  every journaled step again: re-derived from the state before it and checked against its digest,
  CPU per step, next to the CPU that planning the step took in the first place; and the same replay
  as it was before a source's read order was shared by the feeds of every re-derived step (each
  step's feeds sorted and hashed all of their source's row groups again: ~20 ms per source at 10k
  row groups; --row-groups sets how many each source has).

    .venv/bin/python -m benchmarks.control_plane.journal  # dp 8, 64, 4096
    .venv/bin/python -m benchmarks.control_plane.journal --dp 8 64 --steps 20
    .venv/bin/python -m benchmarks.control_plane.journal --dp 8 --steps 20 --row-groups 10000
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from benchmarks.common.benchlib import argument_parser, log, print_header
from benchmarks.control_plane.plan_time import synthetic_planner
from flight_overlord.journal import journal_size
from flight_overlord.planner.feed import SourceFeed
from flight_overlord.planner.planner import Planner
from flight_overlord.planner.replay import SourceReader, step_record


class ReadOrderPerStep(SourceReader):
    """Replay as before the read order was shared: each re-derived step's feeds with a read order of
    their own (sorted, every row group hashed, again)."""

    def feed(self, name: str, offset: int) -> SourceFeed:
        shared = super().feed(name, offset)
        return SourceFeed(name, shared.row_groups, shared.seed, shared.fetch_meta, shared.window)


def measure(dp: int, steps: int, workdir: Path, row_groups: int) -> dict:
    feeds, _, strategy, _ = synthetic_planner(dp, workdir=workdir, row_groups=row_groups)
    cfg = strategy.cfg

    def planner(resume: bool) -> Planner:
        p = Planner(cfg, strategy, lambda source: feeds[source].fetch_meta)
        p.open(resume=resume)
        for name, feed in feeds.items():
            p.roster.register_loader(name, 0, 0, "grpc://127.0.0.1:1",
                                       [[rg.file, rg.row_group, rg.num_rows] for rg in feed.row_groups])
        p.start_feeds()
        return p

    live = planner(False)
    journal = cfg.run_dir / "plan-journal.jsonl"
    out = {"dp": dp, "samples": 0, "before": 0, "now": 0, "before_cpu": 0.0, "now_cpu": 0.0, "plan_cpu": 0.0,
           "metadata": 0}
    for _ in range(steps):
        size = journal_size(journal)
        t = time.process_time()
        plan = live.plan_next()
        out["plan_cpu"] += time.process_time() - t
        out["now"] += journal_size(journal) - size
        state = live._planning_state()
        t = time.process_time()
        before = json.dumps({**plan.to_record(), "state": state}, separators=(",", ":"))
        out["before_cpu"] += time.process_time() - t
        t = time.process_time()
        json.dumps({**step_record(plan, plan.weights, False, {}), "state": state}, separators=(",", ":"))
        out["now_cpu"] += time.process_time() - t
        out["before"] += len(before) + 1
        out["samples"] += len(plan.table)
        out["metadata"] += len(json.dumps(plan.table.tokens.tolist(), separators=(",", ":")))
    live.close()
    for key, per_step in (("replay_cpu", False), ("replay_before_cpu", True)):
        restarted = planner(True)
        if per_step:  # the bench's stand-in for the replay of before (the live reader swapped)
            restarted.replayer._live = ReadOrderPerStep(cfg, restarted.replayer.unreadable,
                                                        lambda source: feeds[source].fetch_meta,
                                                        restarted.roster.source_row_groups)
        t = time.process_time()
        for step in range(steps):
            restarted.journaled(step)
        out[key] = time.process_time() - t
        restarted.close()
    out["plan_cpu"] -= out["now_cpu"]  # plan_next journals too: its planning part
    return {k: v / steps if k not in ("dp",) else v for k, v in out.items()}


def main() -> None:
    p = argument_parser(__doc__)
    p.add_argument("--dp", type=int, nargs="+", default=[8, 64, 4096])
    p.add_argument("--steps", type=int, default=6, help="steps planned per dp (default 6)")
    p.add_argument("--row-groups", type=int, default=2, help="row groups per source (default 2)")
    args = p.parse_args()
    print_header()
    rows = []
    for dp in args.dp:
        with tempfile.TemporaryDirectory(prefix=f"bench_journal-{dp}-") as tmp:
            steps = max(2, min(args.steps, 3)) if dp >= 2048 else args.steps
            log(f"dp {dp}: {steps} steps")
            rows.append(measure(dp, steps, Path(tmp), args.row_groups))
    print("\n| dp | samples / step | journal / step before (whole plan) | now (inputs + state + digest) | ratio "
          "| + row-group metadata instead of the files | record CPU before | now | replay one step (restarted) "
          "| replay, read order per step (before) | planning it first |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['dp']} | {r['samples']:,.0f} | {r['before'] / 1024:,.1f} KiB | {r['now'] / 1024:,.1f} KiB "
              f"| {r['before'] / r['now']:,.0f}x | {r['metadata'] / 1024:,.1f} KiB "
              f"| {1e3 * r['before_cpu']:,.1f} ms | {1e3 * r['now_cpu']:,.1f} ms "
              f"| {1e3 * r['replay_cpu']:,.0f} ms | {1e3 * r['replay_before_cpu']:,.0f} ms "
              f"| {1e3 * r['plan_cpu']:,.0f} ms |")


if __name__ == "__main__":
    main()
