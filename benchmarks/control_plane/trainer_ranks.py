"""The control plane at scale: what N trainer ranks cost one Planner, measured to where this machine
allows and modelled beyond.

Two parts, each printed with what was measured and what is modelled:

1. live      a real cluster per N in --ranks (the demo corpus's six text sources, one loader each,
             K = --constructors Data Constructors, ``dp_per_constructor`` = N / K), tiny steps so that
             2 cores can drive N ranks: one sample of at most --context tokens per rank and step
             (``samples_per_step: N``, one microbatch). The N ranks are simulated by --clients client
             processes, each multiplexing N / clients ranks over a few threads that share one Flight
             client per server, on rank streams (TrainerClient's path): per rank one ``("rank", R, 0,
             END)`` ticket from the Planner, then one long-lived ``do_get`` at its constructor, read a
             record batch (a step) at a time. After --warmup steps, --steps timed steps:
             - Planner CPU per step (and per rank-step): the Planner process's user+system CPU over
               the timed steps / steps; the Planner's sustainable steps/s = 1 / that (one core);
             - p50 / p99 time to a step's batch: per rank-step, from the client asking its stream for
               the step (``read_chunk``) to the record batch;
             - journal bytes per step: the plan journal's size / the steps it holds;
             - PSS of the Planner and of the constructors (psutil), at the end.
2. planning  the pure ``plan_step`` at N x 72 samples per rank (the synthetic long-document steps of
             ``benchmarks.control_plane.plan_time``, greedy, no servers) and the journal record it makes
             (``step_record`` + JSON: the step's inputs and a digest of its plan, not its samples;
             ``benchmarks.control_plane.journal`` sets it beside a whole-plan record): the part of
             the Planner's per-step work that grows with samples, measured up to 4,096 ranks in-process.

Model beyond the live runs: Planner CPU per step = fixed + per-rank x N, fitted (least squares) on
the live runs; with it, the CPU per step and the sustainable steps/s at 4,096 (when not run) and
16,384 ranks, and for the paper's step shape the measured planning of part 2 plus the
per-rank cost (rank streams, constructor plans). Figures are wall/CPU time on a shared 2-core machine
(the header gives the load).

    .venv/bin/python -m benchmarks.control_plane.trainer_ranks  # N = 64 .. 1024, ~5 min
    .venv/bin/python -m benchmarks.control_plane.trainer_ranks --ranks 64 256 1024 4096 --steps 4
    .venv/bin/python -m benchmarks.control_plane.trainer_ranks --plot docs/methods/control-plane-scale.png
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pyarrow.flight as fl

from benchmarks.common.benchlib import (
    REPO,
    MiB,
    add_corpus_args,
    argument_parser,
    log,
    print_header,
    pyplot,
    save_plot,
    workspace,
    write_config,
)

SOURCES = {"captions": 0.15, "longdocs": 0.25, "code": 0.20, "docstrings": 0.15, "manuals": 0.15, "qa": 0.10}
MODEL_RANKS = (4096, 16384)


# ---------------------------------------------------------------------------------------------
# A client process: ranks [first, last) multiplexed over a few threads
# ---------------------------------------------------------------------------------------------

def client_main(planner: str, first: int, last: int, steps: int, threads: int) -> None:
    """Read steps 0..steps-1 of ranks first..last-1 on their rank streams (one Planner ticket per rank,
    then one long-lived ``do_get`` at its constructor, read chunk by chunk: the TrainerClient's path);
    print one JSON line per step: {"step", "latency": [seconds per rank from asking the stream for the
    step to its record batch], "bytes"}."""
    clients: dict[str, fl.FlightClient] = {}
    lock = threading.Lock()

    def client(location: str) -> fl.FlightClient:
        with lock:
            if location not in clients:
                clients[location] = fl.FlightClient(location)
            return clients[location]

    def open_stream(rank: int):
        descriptor = fl.FlightDescriptor.for_path("rank", str(rank), "0", str(steps))
        endpoint = client(planner).get_flight_info(descriptor).endpoints[0]
        return client(endpoint.locations[0].uri.decode()).do_get(endpoint.ticket)

    def next_step(step: int, reader) -> tuple[float, int]:
        started = time.perf_counter()
        batch = reader.read_chunk().data
        if batch.num_rows and batch.column("step")[0].as_py() != step:
            raise RuntimeError(f"the rank stream sent step {batch.column('step')[0].as_py()}, expected {step}")
        return time.perf_counter() - started, batch.nbytes

    with ThreadPoolExecutor(threads) as pool:
        readers = list(pool.map(open_stream, range(first, last)))
        for step in range(steps):
            results = list(pool.map(lambda reader: next_step(step, reader), readers))
            print(json.dumps({"step": step, "latency": [r[0] for r in results], "bytes": sum(r[1] for r in results)}),
                  flush=True)
        for reader in readers:
            reader.cancel()


# ---------------------------------------------------------------------------------------------
# Part 1: live clusters
# ---------------------------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def pss(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_full_info().pss
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


def journal_bytes_per_step(run_dir: Path) -> tuple[float, int]:
    path = run_dir / "plan-journal.jsonl"
    from flight_overlord.journal import journal_size, read_journal
    plans = sum(1 for _, record in read_journal(path) if "digest" in record)  # one per step (archive too)
    return journal_size(path) / max(plans, 1), plans


def live_row(n: int, args, tmp: Path, data_dir: Path) -> dict:
    from flight_overlord.deploy.launch import LocalCluster
    k = min(args.constructors, n)
    config = write_config(
        tmp / f"scale-{n}.yaml", data_dir, [{"name": s, "weight": w} for s, w in SOURCES.items()],
        ranks=n, context_length=args.context, microbatches=1, tokens_per_step=0, seed=7, run_dir=tmp / f"run-{n}",
        global_batch={"context_length": args.context, "microbatches": 1, "samples_per_step": n},
        constructor={"dp_per_constructor": n // k}, balance={"method": "greedy"}, prefetch=2)
    total = args.warmup + args.steps
    started = time.monotonic()
    with LocalCluster(config) as cluster:
        log(f"N={n}: cluster up in {time.monotonic() - started:.1f} s ({k} constructors)")
        planner = next(c for c in cluster.children if c.name == "planner").process.pid
        constructors = [c.process.pid for c in cluster.children if c.name.startswith("constructor")]
        clients = min(args.clients, n)
        bounds = np.linspace(0, n, clients + 1).astype(int)
        procs = [subprocess.Popen([sys.executable, "-m", __spec__.name, "--client", cluster.planner, str(a), str(b),
                                   str(total), str(args.threads)], stdout=subprocess.PIPE, text=True, cwd=REPO)
                 for a, b in zip(bounds[:-1], bounds[1:])]
        latencies, marks = [], {}

        def read(proc) -> None:
            for line in proc.stdout:
                record = json.loads(line)
                step = record["step"]
                with lock:
                    seen[step] = seen.get(step, 0) + 1
                    if seen[step] == len(procs):  # every client process has the step: a global step done
                        marks[step] = (time.perf_counter(), cpu_seconds(planner))
                    if step >= args.warmup:
                        latencies.extend(record["latency"])

        lock, seen = threading.Lock(), {}
        readers = [threading.Thread(target=read, args=(p,), daemon=True) for p in procs]
        for t in readers:
            t.start()
        deadline = time.monotonic() + args.timeout
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        for t in readers:
            t.join()
        if any(p.returncode for p in procs) or len(marks) < total:
            raise SystemExit(f"N={n}: a client process failed (steps done: {sorted(marks)})")
        (t0, c0), (t1, c1) = marks[args.warmup - 1], marks[total - 1]
        journal, plans = journal_bytes_per_step(cluster.cfg.run_dir)
        row = {"ranks": n, "constructors": k, "planner_cpu_step": (c1 - c0) / args.steps,
               "wall_step": (t1 - t0) / args.steps, "p50": float(np.percentile(latencies, 50)),
               "p99": float(np.percentile(latencies, 99)), "journal_step": journal, "planned": plans,
               "planner_pss": pss(planner), "constructor_pss": sum(pss(p) for p in constructors) / len(constructors)}
    log(f"N={n}: {json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})}")
    return row


# ---------------------------------------------------------------------------------------------
# Part 2: planning at the paper's step shape, in process
# ---------------------------------------------------------------------------------------------

def planning_row(n: int, steps: int) -> dict:
    from benchmarks.control_plane.plan_time import PER_RANK, synthetic_planner
    from flight_overlord.planner.program import plan_step
    from flight_overlord.planner.replay import step_record
    feeds, mixer, strategy, weights = synthetic_planner(n, method="greedy")
    plan_step(0, feeds, mixer, strategy, weights)  # untimed: the feeds generate their first metadata
    plan_s = record_s = size = 0.0
    for step in range(1, steps + 1):
        t = time.process_time()
        plan = plan_step(step, feeds, mixer, strategy, weights)
        t2 = time.process_time()
        size += len(json.dumps(step_record(plan, weights, False, {})))  # what the journal holds of a step
        plan_s, record_s = plan_s + t2 - t, record_s + time.process_time() - t2
    return {"ranks": n, "samples": n * PER_RANK, "plan_cpu": plan_s / steps, "record_cpu": record_s / steps,
            "record_bytes": size / steps}


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def fit(live: list[dict]) -> tuple[float, float]:
    """(fixed seconds, seconds per rank) of Planner CPU per step, least squares over the live runs."""
    n = np.array([r["ranks"] for r in live], dtype=float)
    y = np.array([r["planner_cpu_step"] for r in live])
    if len(live) == 1:
        return 0.0, float(y[0] / n[0])
    b, a = np.polyfit(n, y, 1)
    return float(max(a, 0.0)), float(b)


def rate(cpu_per_step: float) -> str:
    """Steps per second of one core; a run too short for the clock's ticks (10 ms) measured no CPU."""
    return f"{1 / cpu_per_step:.2f}" if cpu_per_step > 0 else "- (too few steps to measure)"


def report(live: list[dict], planning: list[dict]) -> tuple[float, float]:
    print("\nPart 1, live (measured): one sample per rank and step, rank streams\n")
    print("| ranks | constructors | Planner CPU / step | per rank-step | Planner steps/s (1 core) | wall / step "
          "| step's batch p50 | p99 | journal / step | Planner PSS | constructor PSS (each) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in live:
        print(f"| {r['ranks']} | {r['constructors']} | {1e3 * r['planner_cpu_step']:.1f} ms "
              f"| {1e6 * r['planner_cpu_step'] / r['ranks']:.0f} us | {rate(r['planner_cpu_step'])} "
              f"| {1e3 * r['wall_step']:.0f} ms | {1e3 * r['p50']:.1f} ms | {1e3 * r['p99']:.1f} ms "
              f"| {r['journal_step'] / 1024:.1f} KiB | {r['planner_pss'] / MiB:.0f} MiB "
              f"| {r['constructor_pss'] / MiB:.0f} MiB |")
    a, b = fit(live)
    print(f"\nModel (fitted on the live rows): Planner CPU per step = {1e3 * a:.1f} ms + {1e6 * b:.0f} us x ranks\n")
    print("| ranks | Planner CPU / step | per rank-step | Planner steps/s (1 core) | source |")
    print("|---:|---:|---:|---:|---|")
    for r in live:
        cpu = r["planner_cpu_step"]
        print(f"| {r['ranks']} | {1e3 * cpu:.1f} ms | {1e6 * cpu / r['ranks']:.0f} us | {rate(cpu)} "
              "| measured (live) |")
    measured = {r["ranks"] for r in live}
    for n in MODEL_RANKS:
        if n not in measured:
            cpu = a + b * n
            print(f"| {n} | {1e3 * cpu:.1f} ms | {1e6 * cpu / n:.0f} us | {rate(cpu)} | modelled (fit above) |")
    if planning:
        print(f"\nPart 2, planning at the paper's step shape (measured, in process, CPU time): "
              f"{planning[0]['samples'] // planning[0]['ranks']} samples per rank, greedy\n")
        print("| ranks | samples | plan_step CPU | journal record CPU | record bytes | + per-rank serving (modelled) "
              "| Planner steps/s (modelled) |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for r in planning:
            tickets = b * r["ranks"]  # the fitted per-rank Planner cost of the live runs (constructor plans, streams)
            cpu = r["plan_cpu"] + r["record_cpu"] + tickets
            print(f"| {r['ranks']} | {r['samples']:,} | {1e3 * r['plan_cpu']:.0f} ms | {1e3 * r['record_cpu']:.0f} ms "
                  f"| {r['record_bytes'] / MiB:.1f} MiB | {1e3 * tickets:.0f} ms | {rate(cpu)} |")
    return a, b


def plot(live: list[dict], planning: list[dict], model: tuple[float, float], path: Path) -> None:
    plt = pyplot(path)
    if plt is None:
        return
    a, b = model
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ns = [r["ranks"] for r in live]
    ax.plot(ns, [1e3 * r["planner_cpu_step"] for r in live], "C0o-", label="Planner CPU / step, live (measured)")
    xs = np.array([min(ns), max(MODEL_RANKS)], dtype=float)
    ax.plot(xs, 1e3 * (a + b * xs), "C0--", label="fitted model (fixed + per rank)")
    ax.plot(ns, [1e3 * r["p99"] for r in live], "C1s-", label="first byte p99, live (measured)")
    if planning:
        ax.plot([r["ranks"] for r in planning], [1e3 * (r["plan_cpu"] + r["record_cpu"]) for r in planning], "C2^-",
                label="plan_step + journal record at 72 samples/rank (measured)")
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlabel="trainer ranks", ylabel="ms", title="Planner cost per step vs ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_plot(fig, path)


def main() -> None:
    if len(sys.argv) == 7 and sys.argv[1] == "--client":
        return client_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    p = argument_parser(__doc__)
    p.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--constructors", type=int, default=4, help="Data Constructors (default 4)")
    p.add_argument("--clients", type=int, default=4, help="client processes simulating the ranks (default 4)")
    p.add_argument("--threads", type=int, default=8, help="fetching threads per client process (default 8)")
    p.add_argument("--context", type=int, default=256, help="tokens per microbatch (default 256)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per N (default 10)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per N before giving up (default 900)")
    p.add_argument("--planning-ranks", type=int, nargs="*", default=[1024, 4096])
    p.add_argument("--planning-steps", type=int, default=3)
    p.add_argument("--plot", type=Path, default=None)
    add_corpus_args(p, scale=0.1)
    args = p.parse_args()
    if args.warmup < 1 or args.steps < 1:
        p.error("--warmup and --steps must be at least 1 (the timed steps are measured from the last warm-up step)")
    print_header()
    live = []
    with workspace("bench-scale-", args.data, list(SOURCES), args.scale) as (tmp, data_dir):
        for n in args.ranks:
            live.append(live_row(n, args, tmp, data_dir))
    planning = []
    for n in args.planning_ranks:
        planning.append(planning_row(n, args.planning_steps))
        log(f"planning at {n} ranks: {json.dumps(planning[-1])}")
    model = report(live, planning)
    if args.plot:
        plot(live, planning, model, args.plot)


if __name__ == "__main__":
    sys.exit(main())
