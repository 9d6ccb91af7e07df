"""``vision.image_text`` part 2: end-to-end deployments with images decoded at the constructor or at the
loader; per rank what it read, the wire bytes and the processes' PSS and CPU."""
from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.common.benchlib import PssSampler, cluster_roots, log, plan_imbalance, write_config
from flight_overlord.deploy.status import cluster_status
from flight_overlord.wire.server import ClientPool

# (name, weight, image-text?) of the end-to-end deployments
DEPLOYMENT_SOURCES = (("imagecaps", 0.5, True), ("interleaved", 0.3, True), ("captions", 0.2, False))


# ---------------------------------------------------------------------------------------------
# Part 2: end to end, decode_at constructor vs loader
# ---------------------------------------------------------------------------------------------

def deployment_config(path: Path, data_dir: Path, args, decode_at: str) -> Path:
    image_columns = {"text_column": "texts", "image_column": "images"}
    sources = [{"name": name, "weight": weight, **(image_columns if image_text else {})}
               for name, weight, image_text in DEPLOYMENT_SOURCES]
    return write_config(path, data_dir, sources, ranks=args.ranks, context_length=args.context_length,
                        microbatches=args.microbatches, tokens_per_step=args.tokens_per_step, seed=0,
                        run_dir=path.parent / f"run-{decode_at}",
                        vision={"decode_at": decode_at, "patch_size": 14, "merge_size": 2})


def wire_counters(planner: str, pool: ClientPool) -> dict[str, int | None]:
    """Bytes served by the loaders of each source, fetched by all constructors (None: no such source),
    and the constructors' bad samples: from ``cluster_status``, which must find every role up."""
    status = cluster_status(planner, pool=pool)
    if not status["up"]:
        raise RuntimeError(f"roles down: {'; '.join(status['totals']['down'])}")
    totals = status["totals"]
    out: dict[str, int | None] = {f"served:{name}": totals["bytes_served_by_source"].get(name)
                                  for name, _, _ in DEPLOYMENT_SOURCES}
    out["fetched"] = totals["bytes_fetched"]
    out["bad_samples"] = totals["bad_samples"]
    return out


@dataclass
class RankTally:
    """What one rank received in the timed phase."""
    steps: int = 0
    samples: int = 0
    patches: int = 0
    bytes: int = 0
    pixel_bytes: int = 0
    step_patches: list[int] = field(default_factory=list)
    t1: float = 0.0
    digest: object = field(default_factory=hashlib.blake2b)  # of the sample keys and grids received
    error: str | None = None

    def add(self, table: pa.Table) -> None:
        keys = pc.list_flatten(table.column("sample_keys"))
        grids = pc.list_flatten(table.column("image_grid_thw")).to_numpy().reshape(-1, 3)
        self.steps += 1
        self.samples += len(keys)
        self.step_patches.append(int(grids.prod(axis=1).sum()))
        self.patches += self.step_patches[-1]
        self.bytes += table.nbytes
        self.pixel_bytes += len(pc.list_flatten(table.column("pixel_values")))
        self.digest.update("\n".join(keys.to_pylist()).encode() + grids.astype(np.int32).tobytes())


def read_rank(planner: str, rank: int, args, barrier: threading.Barrier, tally: RankTally) -> None:
    from flight_overlord.client.trainer import StepFetcher
    fetcher = StepFetcher(planner, rank, timeout=args.timeout)
    try:
        for step in range(args.warmup):
            fetcher.fetch(step)
        barrier.wait()
        for step in range(args.warmup, args.warmup + args.steps):
            tally.add(fetcher.fetch(step))
        tally.t1 = time.monotonic()
    except Exception as exc:  # noqa: BLE001 - reported by the driver
        tally.error = f"rank {rank}: {type(exc).__name__}: {exc}"
        barrier.abort()
    finally:
        fetcher.close()


@dataclass
class Deployment:
    decode_at: str
    tallies: list[RankTally]
    elapsed: float
    before: dict[str, int | None]
    after: dict[str, int | None]
    sampler: PssSampler
    driver_cpu: float
    steps: int
    bad_samples: int
    notes: list[str] = field(default_factory=list)

    def total(self, name: str) -> int:
        return sum(getattr(t, name) for t in self.tallies)

    @property
    def patch_imbalance(self) -> float:
        """Image patches of the busiest rank over the mean rank, averaged over the timed steps."""
        per_step = np.array([t.step_patches for t in self.tallies], dtype=float)  # [ranks, steps]
        return float(np.mean(per_step.max(axis=0) / np.maximum(per_step.mean(axis=0), 1.0)))

    def rate(self, name: str) -> float:
        return self.total(name) / self.elapsed

    def counter(self, key: str) -> float | None:
        """A wire counter's growth over the timed phase, per step (None: not available)."""
        if self.before.get(key) is None or self.after.get(key) is None:
            return None
        return (self.after[key] - self.before[key]) / self.steps

    @property
    def served(self) -> float | None:
        per_source = [self.counter(f"served:{name}") for name, _, _ in DEPLOYMENT_SOURCES]
        return None if None in per_source else sum(per_source)

    def cpu(self, prefix: str) -> float:
        """CPU seconds per step of the process kinds whose label starts with ``prefix``."""
        return sum(c for label, c in self.sampler.cpu_by_label.items() if label.startswith(prefix)) / self.steps


def run_deployment(args, config: Path, decode_at: str) -> Deployment:
    from flight_overlord.deploy.launch import LocalCluster

    started = time.monotonic()
    with LocalCluster(config) as cluster:
        log(f"[{decode_at}] {len(cluster.children)} role processes up in {time.monotonic() - started:.1f}s")
        roles = cluster_roots(cluster, by_source=True)
        pool = ClientPool()
        sampler = PssSampler(lambda: roles)
        start: dict = {}

        def begin_timing() -> None:  # run by the last rank to finish warming up, before any timed fetch
            try:
                start["counters"] = wire_counters(cluster.planner, pool)
                sampler.sample()
                sampler.start()
                start["cpu"], start["t0"] = time.process_time(), time.monotonic()
            except Exception as exc:  # the barrier then breaks, and the ranks stop
                start["error"] = f"starting the timed phase: {type(exc).__name__}: {exc}"
                raise

        barrier = threading.Barrier(args.ranks, action=begin_timing)
        tallies = [RankTally() for _ in range(args.ranks)]
        threads = [threading.Thread(target=read_rank, args=(cluster.planner, r, args, barrier, tallies[r]),
                                    name=f"rank{r}", daemon=True) for r in range(args.ranks)]
        try:
            for t in threads:
                t.start()
            deadline = time.monotonic() + args.timeout
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            errors = [start["error"]] if "error" in start else [t.error for t in tallies if t.error]
            if errors:
                raise RuntimeError("; ".join(errors))
            if any(t.is_alive() for t in threads):
                raise TimeoutError(f"[{decode_at}] ranks not done after {args.timeout:.0f}s")
            sampler.stop()
            driver_cpu = time.process_time() - start["cpu"]
            after = wire_counters(cluster.planner, pool)
            imbalance = plan_imbalance(cluster.planner, args.warmup, args.warmup + args.steps - 1)
        finally:
            pool.close()  # on an error the sampler's daemon thread samples on until the script exits
    elapsed = max(t.t1 for t in tallies) - start["t0"]
    result = Deployment(decode_at, tallies, elapsed, start["counters"], after, sampler, driver_cpu, args.steps,
                        after["bad_samples"])
    result.notes.append(imbalance)
    result.notes.append(f"image patches per rank, max/mean, mean over the timed steps: {result.patch_imbalance:.3f}")
    result.notes += sampler.summary()
    return result
