"""Mixture-driven scaling (loader.scaling): what adding a loader actor costs, and the same run without.

Two parts:

1. reshard logic   the pure work of one scaling decision on a source of R row groups (R = --rows):
                   the Planner's ``Ownership.boundary`` (past every current owner's read-ahead) and
                   ``extend``, then an actor's view after it (the first ``local``/``position`` after a
                   reshard builds the epoch prefix up to the new segment: here at epoch 3).
2. live scaling    two clusters side by side on the demo corpus, the same staged schedule (``code``
                   goes from 0.2 to 0.8 of the mixture at --heavy-at and back at --light-at), one with
                   ``loader.scaling`` (interval 3, up 0.5, down 0.2, consecutive 2, max_actors 2) and one
                   without: the wall time of --steps steps read as fast as they go by one StepFetcher
                   per rank, whether the streams are identical, and, with scaling, the time from the
                   scale-up showing in the Planner's status to the added actor's first bytes served
                   (``overlord status`` polled every 50 ms, on both sides) and the steps in between.

    .venv/bin/python -m benchmarks.loaders.actor_scaling
    .venv/bin/python -m benchmarks.loaders.actor_scaling --rows 1000 10000 --steps 60 --data /tmp/corpus

Timings are wall-clock on a possibly shared machine (the header gives the load average).
"""
from __future__ import annotations

import threading
import time

from benchmarks.common.benchlib import add_corpus_args, argument_parser, log, print_header, workspace, write_config
from flight_overlord.client import StepFetcher
from flight_overlord.core.order import RowGroupRef
from flight_overlord.core.scaling import Ownership
from flight_overlord.deploy.launch import LocalCluster
from flight_overlord.deploy.status import cluster_status
from flight_overlord.harness import step_digest

WEIGHTS = {"captions": 0.15, "longdocs": 0.25, "code": 0.20, "docstrings": 0.15, "manuals": 0.15, "qa": 0.10}


def reshard_logic(rows: int) -> dict:
    catalog = [RowGroupRef(f"f{i // 1000}.parquet", i % 1000, 100) for i in range(rows)]
    ownership = Ownership(catalog, seed=0, source="code", segments=[[0, 2]])
    cursor = 3 * rows + rows // 2
    t0 = time.perf_counter()
    boundary = ownership.boundary(cursor, 2)
    ownership.extend(boundary, 3)
    t1 = time.perf_counter()
    view = ownership.actor_slots(2)
    local = view.local(next(g for g in range(boundary, boundary + rows) if ownership.owner_at(g) == 2))
    t2 = time.perf_counter()
    view.global_slot(local + 1)
    t3 = time.perf_counter()
    return {"decision_ms": (t1 - t0) * 1e3, "view_ms": (t2 - t1) * 1e3, "next_ms": (t3 - t2) * 1e3,
            "distance": boundary - cursor}


def drive(planner: str, ranks: int, steps: int, on_step=None) -> tuple[list, float]:
    fetchers = [StepFetcher(planner, r, timeout=120) for r in range(ranks)]
    digests, start = [], time.perf_counter()
    for step in range(steps):
        for f in fetchers:
            digests.append(step_digest(f.fetch(step)))
        if on_step:
            on_step(step)
    elapsed = time.perf_counter() - start
    for f in fetchers:
        f.close()
    return digests, elapsed


def live(tmp, data_dir, args, enabled: bool) -> dict:
    heavy = {k: (0.8 if k == "code" else 0.04) for k in WEIGHTS}
    strategy = tmp / f"staged-{enabled}.py"
    strategy.write_text("from flight_overlord.orchestration import staged\n"
                        f"def build(s):\n    return s.mix(staged([(0, {WEIGHTS!r}), ({args.heavy_at}, {heavy!r}), "
                        f"({args.light_at}, {WEIGHTS!r})]))\n")
    sources = [{"name": n, "weight": w} for n, w in WEIGHTS.items()]
    path = write_config(tmp / f"config-{enabled}.yaml", data_dir, sources,
                        ranks=args.ranks, context_length=4096, microbatches=2, tokens_per_step=16000, seed=0,
                        run_dir=tmp / f"run-{enabled}", strategy=str(strategy),
                        loader={"hosts": 2, "scaling": {"enabled": enabled, "interval": 3, "up_threshold": 0.5,
                                                        "down_threshold": 0.2, "consecutive": 2, "max_actors": 2}})
    out = {"event_s": None, "first_served_s": None}
    with LocalCluster(path) as cluster:
        stop, current = threading.Event(), {"step": 0}

        def watch():
            while not stop.wait(0.05):
                try:
                    status = cluster_status(cluster.planner, credentials=cluster.credentials, timeout=5)
                except Exception:  # noqa: BLE001 - best effort
                    continue
                events = status["planner"]["counters"].get("scaling", {}).get("events", [])
                out["events"] = events
                if events and out["event_s"] is None:
                    out["event_s"] = time.perf_counter()
                    out["event_step"], out["event_read"] = events[0]["step"], current["step"]
                served = [lo["counters"].get("bytes_served", 0) for lo in status["loaders"]
                          if (lo["source"], lo["actor"], lo["replica"]) == ("code", 1, 0)]
                if served and served[0] > 0 and out["first_served_s"] is None:
                    out["first_served_s"], out["served_read"] = time.perf_counter(), current["step"]
        threading.Thread(target=watch, daemon=True).start()  # both sides: the polling costs CPU too
        out["digests"], out["seconds"] = drive(cluster.planner, args.ranks, args.steps,
                                               on_step=lambda s: current.__setitem__("step", s))
        stop.set()
    return out


def main() -> None:
    parser = argument_parser(__doc__)
    add_corpus_args(parser, scale=0.2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--steps", type=int, default=90)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--heavy-at", type=int, default=8)
    parser.add_argument("--light-at", type=int, default=30)
    args = parser.parse_args()
    print_header()
    print("\n1. reshard logic (one decision: boundary + extend; then the added actor's first lookups)\n")
    print("| row groups | boundary + extend (ms) | actor view, first lookup (ms) | next lookup (ms) "
          "| boundary - cursor |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for rows in args.rows:
        r = reshard_logic(rows)
        print(f"| {rows:,} | {r['decision_ms']:.1f} | {r['view_ms']:.1f} | {r['next_ms']:.3f} | {r['distance']} |")
    with workspace("bench-scaling-", args.data, list(WEIGHTS), args.scale) as (tmp, data_dir):
        log("live: without scaling")
        off = live(tmp, data_dir, args, enabled=False)
        log("live: with scaling")
        on = live(tmp, data_dir, args, enabled=True)
        print(f"\n2. live scaling: {args.steps} steps x {args.ranks} ranks, code 0.2 -> 0.8 at step {args.heavy_at}, "
              f"-> 0.2 at {args.light_at}; corpus scale {args.scale}\n")
        print("| side | wall time (s) | steps/s |")
        print("| --- | ---: | ---: |")
        for name, r in (("loader.scaling off", off), ("loader.scaling on", on)):
            print(f"| {name} | {r['seconds']:.2f} | {args.steps / r['seconds']:.1f} |")
        print(f"\n- streams identical: {on['digests'] == off['digests']}")
        if on["event_s"] and on["first_served_s"]:
            print(f"- scale-up planned at step {on['event_step']} (trainers were reading step {on['event_read']}); "
                  f"the added actor served its first bytes {1e3 * (on['first_served_s'] - on['event_s']):.0f} ms "
                  f"after the event showed in status (trainers at step {on['served_read']})")
        print("- scaling events: " + "; ".join(f"step {e['step']}: {e['source']} {e['previous']} -> {e['actors']} "
                                               f"from position {e['boundary']}" for e in on.get("events", [])))
        if not (on["event_s"] and on["first_served_s"]):
            print(f"- no scale-up observed (event {on['event_s']}, first served {on['first_served_s']})")


if __name__ == "__main__":
    main()
