"""Memory over time: does any role's PSS grow with the step number? (a soak run)

``overlord up``'s roles (``LocalCluster``: Planner, loader hosts, one Data Constructor per rank)
over ``--sources`` demo sources (``overlord make-demo-data --sources N``), driven by one trainer
process per rank iterating ``TrainerClient`` for ``--steps`` steps. Every ``--every`` steps (the
slowest rank's position, from the Planner's ``status``) the PSS of every process is taken
(psutil ``memory_full_info()``) and printed summed per role: PSS, and USS (the pages no
other process shares: PSS also moves with the other programs of the machine, USS does not). The
verdict compares each role's PSS at the last sample with the one at ``--from-step`` (default 2,000):
flat means it grew by at most ``--tolerance`` (default 5%).

    .venv/bin/python -m benchmarks.memory.soak --data /tmp/c96 --steps 20000             # ~10-20 min
    .venv/bin/python -m benchmarks.memory.soak --steps 3000 --every 250 --from-step 500  # a short look
"""
from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import psutil
import pyarrow.flight as fl

from benchmarks.common.benchlib import (
    MiB,
    add_run_args,
    argument_parser,
    cluster_roots,
    log,
    print_header,
    pyplot,
    save_plot,
    tree_usage,
    workspace,
    write_config,
)
from benchmarks.common.rank_processes import stop_processes

ROLES = ("planner", "loader", "constructor", "trainer")


def trainer(planner: str, rank: int, steps: int, finished, release) -> None:
    """One rank: iterate its stream to the end, keeping nothing (as_tensors=False: the Arrow tables),
    then stay up (client open) until the driver has taken its last sample."""
    from flight_overlord.client.trainer import TrainerClient
    with TrainerClient(planner, rank, num_steps=steps, as_tensors=False) as client:
        for _ in client:
            pass
        finished.release()
        release.wait(600)


def slowest_step(client: fl.FlightClient) -> tuple[int, list[str]]:
    """The slowest rank's step, and the loader hosts' locations (from the Planner's status)."""
    from flight_overlord import wire
    status = wire.call(client, "status", {}, timeout=10)
    requested = status["requested"]
    return min(requested.values()) if requested else -1, sorted({row[3] for row in status["loaders"]})


def buffered_bytes(locations: list[str]) -> int:
    """What the loader actors hold (their ``status``): row groups buffered, the part PSS should track."""
    from flight_overlord import wire
    total = 0
    for location in locations:
        client = fl.connect(location)
        total += wire.call(client, "status", {}, timeout=10)["buffered_bytes"]
        client.close()
    return total


def memory_by_role(roots) -> dict[str, int]:
    """PSS per role, and USS per role under "ROLE uss": PSS splits shared library pages over every
    process of the machine, so it moves when other programs start or stop; USS (pages this process
    alone holds) does not, and is what a leak grows."""
    out = dict.fromkeys(ROLES, 0) | {f"{r} uss": 0 for r in ROLES}
    for pid, (label, pss, _) in tree_usage(roots).items():
        out[label] = out.get(label, 0) + pss
        try:
            out[f"{label} uss"] = out.get(f"{label} uss", 0) + psutil.Process(pid).memory_full_info().uss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def soak(args, tmp: Path, data_dir: Path, names: list[str]) -> list[tuple[int, float, dict[str, int]]]:
    from flight_overlord.deploy.launch import LocalCluster
    config = write_config(tmp / "soak.yaml", data_dir, [{"name": n, "weight": 1.0} for n in names],
                          ranks=args.ranks, context_length=args.context_length, microbatches=1,
                          tokens_per_step=int(args.ranks * args.context_length * 0.85), seed=args.seed,
                          run_dir=tmp / "run", balance={"method": "greedy"}, loader={"hosts": args.hosts})
    cluster = LocalCluster(config)
    samples: list[tuple[int, float, dict[str, int]]] = []
    ctx = mp.get_context("spawn")
    procs = []
    try:
        planner = cluster.start()
        roles = cluster_roots(cluster)
        finished, release = ctx.Semaphore(0), ctx.Event()
        procs = [ctx.Process(target=trainer, args=(planner, r, args.steps, finished, release), name=f"trainer-{r}")
                 for r in range(args.ranks)]
        for p in procs:
            p.start()
        roots = lambda: roles + [(p.pid, "trainer", "trainer") for p in procs]  # noqa: E731
        client = fl.connect(planner)
        started, mark = time.monotonic(), args.every
        print(f"\n{'step':>7} {'s':>6}  " + "  ".join(f"{r:>11}" for r in ROLES)
              + "  buffered   (PSS USS per role; the loader actors' buffered row groups; MiB)")
        done = 0
        while done < len(procs):
            if time.monotonic() - started > args.timeout or not all(p.is_alive() for p in procs):
                raise RuntimeError(f"soak: {args.steps} steps not done in {args.timeout:.0f}s, or a trainer died")
            done += finished.acquire(timeout=0.5)
            step, loaders = slowest_step(client)
            if done == len(procs):  # every rank at its last step: the last sample, trainers still up
                step, mark = args.steps - 1, 0
            if step >= mark:
                mem = memory_by_role(roots())
                samples.append((step, time.monotonic() - started, mem))
                per_role = "  ".join(f"{mem[r] / MiB:>5.1f} {mem[r + ' uss'] / MiB:>5.1f}" for r in ROLES)
                print(f"{step:>7} {samples[-1][1]:>6.0f}  {per_role}  {buffered_bytes(loaders) / MiB:>8.1f}",
                      flush=True)
                mark = (step // args.every + 1) * args.every
        release.set()
        client.close()
    finally:
        stop_processes(procs)
        cluster.stop()
    return samples


def verdict(samples, args) -> None:
    base = next((s for s in samples if s[0] >= args.from_step), None)
    if base is None or base is samples[-1]:
        print(f"\n(no verdict: fewer than two samples from step {args.from_step} on)")
        return
    last = samples[-1]
    print(f"\ngrowth from step {base[0]} to step {last[0]} ({(last[1] - base[1]) / 60:.1f} min, "
          f"{(last[0] - base[0]) / max(last[1] - base[1], 1e-9):.0f} steps/s):")
    for role in ROLES:
        for kind in ("", " uss"):
            a, b = base[2][role + kind], last[2][role + kind]
            growth = (b - a) / a if a else 0.0
            per_k = (b - a) / MiB / (last[0] - base[0]) * 1000
            flag = "flat" if growth <= args.tolerance else "GROWS"
            print(f"  {role:<12} {kind.strip() or 'pss':<4} {a / MiB:7.1f} -> {b / MiB:7.1f} MiB  {growth:+6.1%}  "
                  f"({per_k:+.2f} MiB per 1,000 steps)  {flag}")


def plot(samples, path: Path) -> None:
    plt = pyplot(path)
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for role in ROLES:
        ax.plot([s[0] for s in samples], [s[2][role] / MiB for s in samples], marker=".", label=role)
    ax.set_xlabel("step")
    ax.set_ylabel("PSS (MiB, summed over the role's processes)")
    ax.set_title("flight_overlord PSS per role over a soak run")
    ax.legend()
    ax.grid(alpha=0.3)
    save_plot(fig, path)


def parse_args(argv=None):
    p = argument_parser(__doc__)
    p.add_argument("--data", type=Path, help="corpus dir (make_many_sources; generated if missing)")
    p.add_argument("--sources", type=int, default=96)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--hosts", type=lambda v: v if v == "auto" else int(v), default="auto")
    p.add_argument("--every", type=int, default=1000, help="sample every this many steps (default 1000)")
    p.add_argument("--from-step", type=int, default=2000, help="the verdict's baseline step (default 2000)")
    p.add_argument("--tolerance", type=float, default=0.05)
    add_run_args(p, steps=20000, timeout=7200.0, context_length=1024, microbatches=None, warmup=None)
    p.add_argument("--plot", type=Path, help="write the PSS-over-steps plot here (needs matplotlib)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    print_header()
    with workspace("bench-soak-", args.data, [], 1.0) as (tmp, data_dir):
        from benchmarks.memory.sources_ranks import ensure_many
        names = ensure_many(data_dir, args.sources, args)
        log(f"soak: {args.sources} sources, {args.ranks} ranks, {args.steps} steps")
        samples = soak(args, tmp, data_dir, names[:args.sources])
        verdict(samples, args)
        if args.plot and samples:
            plot(samples, args.plot)


if __name__ == "__main__":
    main()
