"""``overlord demo``: the system up locally, one simulated trainer process per rank.

Each trainer pulls its rank's microbatches as torch tensors and reports what it got;
the demo prints per step the realized mixture (from the sample keys the trainers
actually received), the per-rank cost imbalance of the plan against the same samples
unbalanced, and throughput; then a summary.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np
import yaml
from tqdm import tqdm

from .. import wire
from ..config import Config, load_config
from ..deploy.cluster import holds_a_run, move_aside
from ..deploy.launch import LocalCluster
from ..planner.strategy import load_strategy
from ..wire.actions import StatsRequest
from ..wire.security import Credentials
from ..wire.server import connect

DEFAULT_STEPS = 40
SHIPPED_CONFIGS = "flight_overlord.demo.configs"  # the repository's configs/ (pyproject.toml package-dir)


def shipped_demo_config(data_root: str | Path, run_dir: str | Path) -> Path:
    """The shipped ``demo.yaml`` pointed at ``data_root`` and ``run_dir``, written as ``run_dir/demo.yaml``.

    The shipped file's relative paths (``../data/demo``) would resolve inside the installation, so the
    copy states both absolutely (relative ones are taken from the current directory). The roles
    reload the config from that file, so it lives with the run.
    """
    from ..package_data import data_folder
    raw = yaml.safe_load((data_folder(SHIPPED_CONFIGS, "configs") / "demo.yaml").read_text())
    data_root, run_dir = Path(data_root).resolve(), Path(run_dir).resolve()
    raw.update(data_root=str(data_root), run_dir=str(run_dir))
    set_aside_previous_run(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "demo.yaml"
    path.write_text("# Written by `overlord demo`: the shipped configs/demo.yaml with data_root and run_dir\n"
                    "# made absolute. Edit that file (or pass --config) rather than this copy.\n"
                    + yaml.safe_dump(raw, sort_keys=False))
    return path


def ensure_demo_data(config_path: str | Path) -> None:
    """Make the demo sources the config reads (the demo corpus, its image-text sources, long-tail
    sources named ``longtail_<K>k``) where it reads them, if they are not there yet; a source that
    is none of these is an error naming it."""
    from .data import SOURCE_NAMES, make_demo_data
    from .images import IMAGE_SOURCE_NAMES, make_image_demo_data
    from .long_tail import make_long_tail, max_tokens_of_name
    from .navit import COYO_SOURCES, make_coyo, make_navit
    config_path = Path(config_path).resolve()
    raw = yaml.safe_load(config_path.read_text()) or {}
    data_root = (config_path.parent / str(raw.get("data_root", "."))).resolve()
    wanted = {str(s.get("name")) for s in raw.get("sources") or [] if isinstance(s, dict)}
    missing = {name for name in wanted if not (data_root / name).is_dir()}
    long_tail = {name: max_tokens_of_name(name) for name in missing if max_tokens_of_name(name)}
    navit = {name for name in missing if re.fullmatch(r"navit\d{3}", name)}
    coyo = {name for name in missing if name in {f"coyo{i}" for i in range(COYO_SOURCES)}}
    unknown = missing - set(long_tail) - navit - coyo - set(SOURCE_NAMES) - set(IMAGE_SOURCE_NAMES)
    if unknown:
        raise SystemExit(f"error: {config_path}: no data for sources {sorted(unknown)} in {data_root}, and they are "
                         f"not demo sources (overlord make-demo-data makes "
                         f"{', '.join(SOURCE_NAMES + IMAGE_SOURCE_NAMES)}, "
                         f"longtail_<K>k with --long-tail K*1024, navit000.. with --navit N and coyo0..4 with --coyo)")
    if navit:  # navit000 .. navitNNN: the first N of the navit-like sources
        n = 1 + max(int(name[5:]) for name in navit)
        print(f"making the navit-like sources in {data_root} (overlord make-demo-data --navit {n} {data_root}) ...",
              flush=True)
        make_navit(data_root, n, seed=0)
    if coyo:
        print(f"making the coyo-like sources in {data_root} (overlord make-demo-data --coyo {data_root}) ...",
              flush=True)
        make_coyo(data_root, seed=0)
    for name, max_tokens in sorted(long_tail.items()):
        print(f"making the long-tail source {name} in {data_root} "
              f"(overlord make-demo-data --long-tail {max_tokens} {data_root}) ...", flush=True)
        make_long_tail(data_root, name, max_tokens=max_tokens, seed=0)
    demo = missing - set(long_tail) - navit - coyo
    if not demo:
        return
    print(f"making the demo corpus in {data_root} ...", flush=True)
    if demo <= set(IMAGE_SOURCE_NAMES):
        make_image_demo_data(data_root, seed=0)
    else:
        make_demo_data(data_root, seed=0)


def set_aside_previous_run(run_dir: str | Path) -> None:
    """A demo is disposable: a previous run in ``run_dir`` is moved aside (nothing is deleted), said in one line."""
    if holds_a_run(Path(run_dir)):
        print(f"moved the previous demo run aside to {move_aside(Path(run_dir))}", flush=True)


def trainer_process(planner: str, rank: int, steps: int, by_tokens: bool, counts: bool, encoder: bool,
                    results: mp.Queue, credentials: Credentials | None = None) -> None:
    """One simulated trainer. ``counts``: this rank is its bucket's first, so its sample keys are the
    ones the mixture is counted from (other ranks of the bucket get the same samples, or a share).
    ``encoder``: the strategy has an image graph, so the rank also fetches the images it encodes.
    ``credentials``: the demo's trainers are the run's own, so they present its credentials."""
    from ..client import TrainerClient
    with TrainerClient(planner, rank, num_steps=steps, encoder=encoder, credentials=credentials) as client:
        for item in client:
            step_batch, encoder_inputs = item if encoder else (item, [])
            amounts = Counter()  # per source: tokens, or samples when the batch is counted in samples
            losses: dict[str, list[float]] = {}
            for mb in step_batch:
                lengths = (mb["cu_seqlens"][1:] - mb["cu_seqlens"][:-1]).tolist()
                for key, length, cp_rank in zip(mb["sample_keys"], lengths, _cp_ranks(mb)):
                    if cp_rank:  # under HDP a sample on a group of ranks is counted by its first one
                        continue
                    source = key.split(":", 1)[0]
                    amounts[source] += length if by_tokens else 1
                    losses.setdefault(source, []).append(math.log1p(length))
            step = step_batch[0]["step"]
            if counts:  # a stand-in for a model's per-source loss, for dynamic mixing schedules
                client.report(step, {s: sum(v) / len(v) for s, v in losses.items()})
            results.put((rank, step, counts, sum(_cp_ranks(mb).count(0) for mb in step_batch) if counts else 0,
                         dict(amounts) if counts else {},
                         sum(mb["input_ids"].numel() for mb in step_batch if mb["input_ids"] is not None),
                         time.monotonic()))


def _cp_ranks(mb: dict) -> list[int]:
    """Per sample of a microbatch, this rank's CP rank in the sample's group (HDP), else 0."""
    return list(mb.get("seq_cp_rank") or [0] * len(mb["sample_keys"]))


def run_demo(config_path: str | Path, steps: int | None = None) -> dict:
    ensure_demo_data(config_path)
    cfg = load_config(config_path)
    set_aside_previous_run(cfg.run_dir)
    steps = steps or DEFAULT_STEPS
    ranks = cfg.mesh.world_size
    strategy = load_strategy(cfg)
    first_of_bucket = {}
    for r in range(ranks):
        first_of_bucket.setdefault(strategy.mesh.bucket_of(r, strategy.axis), r)
    counting = set(first_of_bucket.values())
    started = time.monotonic()
    with LocalCluster(config_path) as cluster:
        print(f"planner at {cluster.planner}: {len(cluster.children)} processes "
              f"({sum(s.loaders for s in cfg.sources)} loaders for {len(cfg.sources)} sources, "
              f"{cfg.num_constructors} constructors), {ranks} trainer ranks; up in {time.monotonic() - started:.1f}s",
              flush=True)
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        by_tokens, images = cfg.global_batch.tokens_per_step is not None, strategy.image_graph is not None
        trainers = [ctx.Process(target=trainer_process, daemon=True,
                                args=(cluster.planner, r, steps, by_tokens, r in counting, images, results,
                                      cluster.credentials))
                    for r in range(ranks)]
        for t in trainers:
            t.start()
        try:
            summary = _follow(cfg, cluster.planner, steps, ranks, results, trainers, cluster.credentials)
        finally:
            for t in trainers:
                t.join(timeout=5)
                if t.is_alive():
                    t.terminate()
    return summary


def _follow(cfg: Config, planner: str, steps: int, ranks: int, results: mp.Queue, trainers,
            credentials: Credentials | None = None) -> dict:
    client = connect(planner, credentials)
    weights = Counter()  # the schedule's weights, normalised per step and averaged over the steps
    per_step: dict[int, list] = {}
    unit = "tokens" if cfg.global_batch.tokens_per_step is not None else "samples"
    totals, t0, stats_all = Counter(), None, {}
    bar = tqdm(total=steps, unit="step", desc="training", leave=True)
    done = 0
    while done < steps:
        try:
            rank, step, _, n_samples, tokens, padded, when = results.get(timeout=120)
        except Exception:
            dead = [i for i, t in enumerate(trainers) if not t.is_alive()]
            raise RuntimeError(f"no progress from the trainers for 120s (exited ranks: {dead})") from None
        per_step.setdefault(step, []).append((n_samples, tokens, padded, when))
        if len(per_step[step]) < ranks:
            continue
        t0 = t0 or min(w for *_, w in per_step[step])
        rows = per_step.pop(step)
        step_tokens = Counter()
        for _, tokens_by_source, _, _ in rows:
            step_tokens.update(tokens_by_source)
        totals.update(step_tokens)
        stats = wire.call(client, "stats", StatsRequest(step, step).to_wire())[str(step)]
        stats_all[step] = stats
        step_weights = stats["weights"]
        weights.update({k: v / sum(step_weights.values()) / steps for k, v in step_weights.items()})
        elapsed = max(w for *_, w in rows) - t0
        mix = " ".join(f"{s}={100 * step_tokens[s] / max(1, sum(step_tokens.values())):.0f}%" for s in step_weights)
        bar.write(f"step {step:3d} | {unit} {sum(step_tokens.values()):6d} | mix {mix} | backbone imbalance "
                  f"{stats['imbalance']:.3f} (unbalanced {stats['imbalance_unbalanced']:.3f})"
                  f"{_encoder_line(stats['encoder'])} | "
                  f"{sum(totals.values()) / elapsed if elapsed > 0 else 0:,.0f} {unit}/s")
        bar.update(1)
        done += 1
    bar.close()
    client.close()
    return _summary({s.name: weights[s.name] for s in cfg.sources}, totals, stats_all, elapsed, unit)


def _encoder_line(encoder: dict) -> str:
    """The step line's encoder part: only when the step has images."""
    if not encoder["patches"]:
        return ""
    line = f" | encoder max/mean {encoder['imbalance']:.3f}"
    if encoder.get("max_cost", 0) > 0 and "max_cost_vanilla" in encoder:
        line += f", slowest x{encoder['max_cost_vanilla'] / encoder['max_cost']:.2f} faster than vanilla"
    return line


def _summary(weights: dict, totals: Counter, stats: dict, elapsed: float, unit: str) -> dict:
    total = sum(totals.values())
    realized = {s: totals[s] / total for s in weights}
    imb = [s["imbalance"] for s in stats.values()]
    unb = [s["imbalance_unbalanced"] for s in stats.values()]
    speedup = [s["max_rank_cost_unbalanced"] / s["max_rank_cost"] for s in stats.values() if s["max_rank_cost"] > 0]
    print("\nsummary")
    print(f"  {'source':<12} {'weight':>7} {'realized':>9}  (share of {unit})")
    for s in weights:
        print(f"  {s:<12} {weights[s]:7.3f} {realized[s]:9.3f}")
    print(f"  backbone max/mean per-rank cost: balanced {sum(imb) / len(imb):.3f} "
          f"vs unbalanced {sum(unb) / len(unb):.3f} "
          f"(mean over {len(stats)} steps); slowest-rank speedup x{sum(speedup) / len(speedup):.2f}")
    encoder = [s["encoder"] for s in stats.values() if s["encoder"]["patches"]]
    if encoder:
        actual = np.mean([e["imbalance"] for e in encoder])
        line = f"  encoder (image cost) max/mean per consumer: {actual:.3f}"
        if "max_cost_vanilla" in encoder[0]:
            vanilla = np.mean([e["imbalance_vanilla"] for e in encoder])
            speedup = np.mean([e["max_cost_vanilla"] / e["max_cost"] for e in encoder if e["max_cost"] > 0])
            over_lb = np.mean([e["max_cost"] / e["lower_bound"] for e in encoder if e["lower_bound"] > 0])
            line += (f" over every rank (image graph; slowest / lower bound {over_lb:.3f}: one large image can "
                     f"outweigh a rank's share) vs {vanilla:.3f} over data-parallel buckets when images are "
                     f"encoded where their sequence goes; slowest encoder rank x{speedup:.2f} faster")
        print(line + f" (mean over {len(encoder)} steps)")
    print(f"  throughput: {total / elapsed:,.0f} {unit}/s delivered over {elapsed:.1f}s")
    return {"realized": realized, "weights": weights, "imbalance": imb, "imbalance_unbalanced": unb,
            f"{unit}_per_s": total / elapsed}
