"""``overlord audit``: what a run delivered, across every resume, dp change and mixture edit.

Computed from what was recorded as delivered (the constructors' delivery journals: per step and
rank, the plan's bucket and a digest of the keys served), joined with the plan of each step as the
Planner reads it back: its journal replayed once, start to end (``Replayer.in_force``), each step
re-derived from the state the step before left and checked against its digest. A sample is (key,
epoch): the same key in another epoch is a new sample. Duplicates are samples delivered in two steps;
missing are samples planned for a step up to the last one every rank of the latest segment has, but never delivered.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

from ..constructor.deliveries import in_force, keys_digest, read_deliveries
from ..journal import read_journal
from .program import StepPlan

CONFIG_PATH = Path("planner") / "config-path"  # the config a run was started from (for an offline audit)


def audit_run(run_dir: Path, planner, mesh=None) -> dict:
    """The audit of the run in ``run_dir``; ``planner`` reads the journaled plans back, each step's plan in
    force once, re-derived in one pass over its journal (``planner.replayer.in_force()``); the edits are a
    second, parse-only read of it."""
    starts, records, rewinds = read_deliveries(run_dir)
    edits = [r.get("edit") or {"kind": "mix", **r["mix"]} for _, r in read_journal(run_dir / "plan-journal.jsonl")
             if "edit" in r or "mix" in r]
    edits += [{"step": stage.first_step, "kind": f"context {stage.context_length}"}  # a stage's mixture, realized
              for stage in planner.strategy.context_stages if stage.first_step > 0]
    return compute_audit(starts, records, planner.replayer.in_force(), edits, rewinds)


def compute_audit(starts: list[float], records: list[dict], plans: Iterable[StepPlan], edits: list[dict],
                  rewinds: list[dict] = ()) -> dict:
    """Pure: the delivery records, the plan in force of every planned step (any order, each step once:
    read as they come, none kept), the journaled edits and the rank streams' rewinds -> the audit. A step
    served to a rank again (a rewind) is one delivery: the latest (``in_force``); the rewinds are listed."""
    delivered = list(in_force(starts, records))
    served: dict[int, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))  # step -> bucket -> digests
    for record in delivered:
        served[record["step"]][record["bucket"]].append(record["digest"])
    last_segment = max((r["segment"] for r in delivered), default=0)

    seen: Counter = Counter()
    per_source: dict[str, dict] = defaultdict(lambda: {"samples": 0, "duplicates": 0, "missing": 0, "skipped": 0,
                                                       "epochs": set()})
    step_samples: dict[int, Counter] = defaultdict(Counter)
    step_tokens: dict[int, Counter] = defaultdict(Counter)  # planned tokens delivered: the mixer's other unit
    unserved: dict[int, Counter] = {}  # step -> source -> planned samples no rank was served (yet)
    skipped: dict[int, int] = {}  # step -> samples dropped on purpose (overlord skip)
    planned, unverified, last = set(), set(), (-1, 0)  # last: the highest step planned, and its buckets
    for plan in plans:
        step = plan.step
        planned.add(step)
        last = max(last, (step, plan.num_buckets))
        for key, _ in plan.dropped:
            per_source[key.split(":", 1)[0]]["skipped"] += 1
        if plan.dropped:  # the window's samples, dropped when its first step was planned
            first, end = plan.stats.get("dropped_steps", (step, step))
            skipped.update({number: 0 for number in range(first, end + 1)})
            skipped[first] = len(plan.dropped)
        buckets = served.get(step, {})
        for bucket, digests in buckets.items():  # served: its keys count, and must be the plan's
            keys = _bucket_keys(plan, bucket)
            if any(d != keys_digest(k for k, _ in keys) for d in digests):
                unverified.add(step)
            for pick in (p for bin_ in plan.bucket_bins(bucket) for p in bin_):
                step_tokens[step][pick.ref.key.split(":", 1)[0]] += pick.tokens
            for key, epoch in keys:
                source = key.split(":", 1)[0]
                seen[(key, epoch)] += 1
                entry = per_source[source]
                entry["samples"] += 1
                entry["epochs"].add(epoch)
                if seen[(key, epoch)] > 1:
                    entry["duplicates"] += 1
                step_samples[step][source] += 1
        unserved[step] = Counter(key.split(":", 1)[0] for bucket in range(plan.num_buckets) if bucket not in buckets
                                 for key, _ in _bucket_keys(plan, bucket))
    through = _passed_by_all(delivered, last_segment, last[1])
    missing = undelivered = 0
    for step, counts in unserved.items():
        if step > through:  # some rank has not got there yet: on its way, not missing
            undelivered += sum(counts.values())
            continue
        for source, n in counts.items():  # every rank got past it: what no one was served is missing
            per_source[source]["missing"] += n
            missing += n
    samples = sum(seen.values())
    return {
        "samples": samples, "unique": len(seen), "duplicates": samples - len(seen), "missing": missing,
        "not_yet_delivered": undelivered, "planned_through": max(planned, default=-1),
        "skipped": sum(skipped.values()), "skipped_steps": sorted(skipped),
        "steps": len(planned & set(served)), "through_step": through,
        "segments": last_segment + 1 if delivered else 0,
        "unverified": sorted(unverified),
        "unplanned_steps": sorted((set(served) | set(range(through + 1))) - planned),
        "per_source": {s: {**v, "epochs": sorted(v["epochs"])} for s, v in sorted(per_source.items())},
        "phases": _phases(step_samples, step_tokens, edits),
        "rewinds": [{"rank": r["rewind"], "to_step": r["step"], "served_through": r["served"],
                     "steps_again": r["served"] - r["step"] + 1} for r in rewinds],
    }


def _passed_by_all(delivered: list[dict], segment: int, buckets: int) -> int:
    """The last step every rank that reads in ``segment`` (the latest), and some rank of every bucket of
    the latest plan, has been served: a bucket no one read yet holds the audit back."""
    ranks: dict[int, int] = defaultdict(lambda: -1)
    by_bucket: dict[int, int] = {}
    first = min((r["step"] for r in delivered if r["segment"] == segment), default=0)
    for record in delivered:
        if record["segment"] == segment:
            ranks[record["rank"]] = max(ranks[record["rank"]], record["step"])
            by_bucket[record["bucket"]] = max(by_bucket.get(record["bucket"], -1), record["step"])
    if not ranks:
        return -1
    return min(min(ranks.values()), *(by_bucket.get(b, first - 1) for b in range(buckets)))


def _bucket_keys(plan: StepPlan, bucket: int) -> list[tuple[str, int]]:
    return [(p.ref.key, p.ref.epoch) for bin_ in plan.bucket_bins(bucket) for p in bin_]


def _phases(step_samples: dict[int, Counter], step_tokens: dict[int, Counter], edits: list[dict]) -> list[dict]:
    """Per-source samples delivered before and after each mixture edit or context stage, and the realized
    shares of samples and of tokens (the mixer weighs the unit of the global batch)."""
    bounds = sorted({0, *(int(e["step"]) for e in edits)})
    phases = []
    for i, first in enumerate(bounds):
        end = bounds[i + 1] if i + 1 < len(bounds) else None
        counts, tokens = (_summed(per_step, first, end) for per_step in (step_samples, step_tokens))
        phase = {"from_step": first, "to_step": None if end is None else end - 1,
                 "edits": [e for e in edits if int(e["step"]) == first],
                 "samples": dict(sorted(counts.items())), "shares": _shares(counts), "token_shares": _shares(tokens)}
        phases.append(phase)
    return phases


def _summed(per_step: dict[int, Counter], first: int, end: int | None) -> Counter:
    total: Counter = Counter()
    for step, counts in per_step.items():
        if step >= first and (end is None or step < end):
            total.update(counts)
    return total


def _shares(counts: Counter) -> dict[str, float]:
    total = sum(counts.values())
    return {s: n / total for s, n in sorted(counts.items())} if total else {}


def render(report: dict) -> str:
    """The audit as a few lines of text, its words explained."""
    through = report["through_step"]
    passed = (f"steps 0-{through} (which every rank has passed)" if through >= 0
              else "steps every rank has passed (none yet)")
    lines = [f"samples delivered {report['samples']} ({report['unique']} unique)"
             + (f" through step {through}" if through >= 0 else "") + f" in {report['segments']} segment(s): "
             f"duplicates {report['duplicates']}, missing {report['missing']}",
             f"  duplicates: samples delivered in more than one step; missing: samples planned for {passed} "
             f"and never delivered"]
    if report.get("not_yet_delivered"):
        lines.append(f"  not yet delivered: {report['not_yet_delivered']} samples planned for steps {through + 1}-"
                     f"{report['planned_through']}, which some rank has not reached (on a live run: on their way; "
                     f"not missing)")
    if report.get("skipped"):
        lines.append(f"  skipped on purpose (overlord skip): {report['skipped']} samples that steps "
                     f"{_ranges(report['skipped_steps'])} would have had, dropped (not missing); those steps hold the "
                     f"samples after them")
    for rewind in report.get("rewinds", []):
        lines.append(f"rewind: rank {rewind['rank']} went back to step {rewind['to_step']} after step "
                     f"{rewind['served_through']} ({rewind['steps_again']} step(s) served again, not duplicates)")
    if report["unverified"]:
        lines.append(f"steps whose served keys differ from their plan (dropped samples?): {report['unverified']}")
    lines.append(f"{'source':<16}{'samples':>9}{'dupl.':>7}{'missing':>9}{'skipped':>9}  epochs")
    for source, v in report["per_source"].items():
        lines.append(f"{source:<16}{v['samples']:>9}{v['duplicates']:>7}{v['missing']:>9}{v.get('skipped', 0):>9}  "
                     f"{v['epochs']}")
    if len(report["phases"]) > 1:
        lines.append("realized mixture between mixture edits and context stages (shares of samples; of tokens):")
        for phase in report["phases"]:
            end = "" if phase["to_step"] is None else phase["to_step"]
            kinds = ", ".join(e.get("kind", "?") for e in phase["edits"])
            shares = " ".join(f"{s}={x:.3f}" for s, x in phase["shares"].items()) or "nothing delivered yet"
            if phase.get("token_shares"):
                shares += "; tokens " + " ".join(f"{s}={x:.3f}" for s, x in phase["token_shares"].items())
            lines.append(f"  steps {phase['from_step']}-{end}{' (' + kinds + ')' if kinds else ''}: {shares}")
    return "\n".join(lines)


def _ranges(steps: list[int]) -> str:
    """[10, 11, 12, 20] -> '10-12, 20'."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def mark_run_start(cfg, mixture: dict, *, resume: bool) -> None:
    """A Planner starts a run or resumes it (not a restart of the Planner alone): a new segment of
    deliveries, the config it runs (for an offline audit) and its mixture (for the next resume's checks)."""
    from ..constructor.deliveries import mark_segment
    from ..journal import write_json_atomic, write_text_atomic
    from .edits import MIXTURE
    mark_segment(cfg.run_dir, resume=resume)
    if cfg.path is not None:
        write_text_atomic(cfg.run_dir / CONFIG_PATH, str(Path(cfg.path).resolve()))
    write_json_atomic(cfg.run_dir / MIXTURE, mixture)


def offline_audit(run_dir: Path, config: str | None = None) -> dict:
    """The audit of a stopped run, read from ``run_dir`` with the config it was started from."""
    with offline_planner(run_dir, config) as planner:
        return audit_run(Path(run_dir), planner)


def plan_records(run_dir: Path, config: str | None = None) -> list[dict]:
    """Every step record of a run's plan journal, in order, each with its plan (``bins``, ``samples``)
    re-derived from the source files and checked against its digest."""
    with offline_planner(run_dir, config) as planner:
        return list(planner.replayer.records())


@contextmanager
def offline_planner(run_dir: Path, config: str | None = None):
    """A Planner restored from ``run_dir`` that plans nothing: it reads the journal, and re-derives
    journaled steps with the metadata of the source files (no loader needed)."""
    from ..config import load_config
    from .planner import Planner
    from .strategy import load_strategy
    run_dir = Path(run_dir)
    if config is None:
        marker = run_dir / CONFIG_PATH
        if not marker.exists():
            raise FileNotFoundError(f"{run_dir} holds no run (no {CONFIG_PATH}): name a run_dir, or pass --config")
        config = marker.read_text().strip()
    cfg = load_config(config)
    if cfg.run_dir.resolve() != run_dir.resolve():
        raise ValueError(f"config {config} names run_dir {cfg.run_dir}, not {run_dir}")
    planner = Planner(cfg, load_strategy(cfg, cfg.mesh), None)
    planner.open(resume=True)
    try:
        yield planner
    finally:
        planner.close()


def dumps(report: dict) -> str:
    return json.dumps(report, indent=1, sort_keys=True)
