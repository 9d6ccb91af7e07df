"""The paper's VLM setting for ``benchmarks/training/end_to_end.py --workload navit|coyo``: a 12B LLM with a 2B ViT
on the navit-like (306 sources) or coyo-like (5 sources) corpus, Vanilla vs backbone vs hybrid
balance at 4K, 8K and 16K context, planned by the Planner's own placement code.

Per step, samples are drawn from the corpus generator's own distributions
(``flight_overlord.demo.navit``: the same layouts ``make-demo-data --navit`` writes, no files
needed), every source equally likely, until the step's token budget (``fill`` of the ranks'
microbatch capacity) is reached; a sample longer than the context is cut as the loader cuts it
(text cut, an image that does not fit dropped with what follows). Then, per scenario, the planner's
``place`` (and for hybrid ``place_images``) in this process places them:

- ``vanilla``: ``balance: none``, samples packed into microbatches in arrival order, each sample's
  images encoded on its own rank (no data scheduling);
- ``backbone``: ``distribute("DP").balance("greedy")`` on the backbone cost, images with their sequence;
- ``hybrid``: the same, plus ``images().cost("patches", ViT's b/a).distribute("WORLD")
  .balance("karmarkar_karp")`` (configs/strategies/vlm.py's program with the ViT-2B's cost).

Samples a plan leaves out are deferred to the next step (as the Planner defers them). A rank's step
time is its ViT seconds plus the backbone's seconds over its microbatches (the cost models below);
the step ends with the slowest rank; throughput is placed tokens over the summed step times.
No servers run: what this measures is the plan, with the Planner's code, at any rank count. The
end-to-end path with real servers on this machine is ``benchmarks/training/end_to_end.py``'s ``vlm-*`` scenarios.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from benchmarks.common.benchlib import REPO
from benchmarks.training.cost import FLOPS, MFU, TFLOPS, ModelCost

LLM_12B = ModelCost("Llama-12B backbone", 12e9, 45, 4608)
VIT_2B = ModelCost("ViT-2B encoder", 2e9, 48, 1664)
CONTEXTS = (4096, 8192, 16384)
SCENARIOS = ("vanilla", "backbone", "hybrid")
EQUAL_SAMPLES = "vanilla-samples"  # a per-GPU batch size: the same sample count per rank, not the same tokens
PAPER = {4096: 1.71, 8192: 2.63, 16384: 3.09}  # the paper's average hybrid speedups (its Sec. 7.3, Fig. 13)
VISION = {"navit": {"patch_size": 14, "merge_size": 2, "max_pixels": 28 * 28 * 1280},  # Qwen2-VL's default cap
          "coyo": {"patch_size": 16, "merge_size": 2, "max_pixels": 32 * 32 * 1280}}


@dataclass(frozen=True)
class Drawn:
    """One sample as the planner sees it: tokens (placeholders included) and each image's patches."""
    source: int
    tokens: int
    image_patches: tuple[int, ...]


class SampleStream:
    """Samples of a corpus, one source (uniform) per draw, cut to the context like the loader cuts."""

    def __init__(self, workload: str, context: int, seed: int, sources: int | None = None):
        from flight_overlord.core.vision import VisionSpec
        from flight_overlord.demo.navit import coyo_profiles, navit_profiles
        self.profiles = navit_profiles(sources or 306, seed=seed) if workload == "navit" else coyo_profiles(seed=seed)
        v = VISION[workload]
        self.spec = VisionSpec(v["patch_size"], v["merge_size"], max_pixels=v["max_pixels"])
        self.context = context
        self.rng = np.random.default_rng([seed, 14_000, context])

    def draw(self) -> Drawn:
        from flight_overlord.core.vision import num_patches, patch_grid, placeholder_tokens
        from flight_overlord.demo.navit import sample_layout
        i = int(self.rng.integers(len(self.profiles)))
        used, patches = 1, []  # the tokenizer's end-of-text
        for kind, value in sample_layout(self.profiles[i], self.rng):
            if kind == "text":
                used = min(self.context, used + value)
            else:
                grid = patch_grid(*value, self.spec)
                run = placeholder_tokens(grid, self.spec) + 2
                if used + run > self.context:
                    break  # never split an image's run: it and what follows are dropped
                used += run
                patches.append(num_patches(grid))
            if used >= self.context:
                break
        return Drawn(i, used, tuple(patches))


def make_strategy(scenario: str, ranks: int, context: int, microbatches: int, workdir: Path):
    """A Strategy over a one-source config (placement reads no files), programmed as the scenario says."""
    from flight_overlord.config import load_config
    from flight_overlord.planner.strategy import Strategy, load_strategy
    (workdir / "x.parquet").touch()
    raw = {"seed": 0, "data_root": str(workdir), "run_dir": str(workdir / "run"),
           "sources": [{"name": "model", "paths": "x.parquet"}], "mesh": {"dp": ranks},
           "global_batch": {"context_length": context, "microbatches": microbatches, "tokens_per_step": 1},
           "cost": {"model": "attention", "a": 1.0, "b": LLM_12B.b / LLM_12B.a},
           "balance": {"method": "none" if scenario == "vanilla" else "greedy"}}
    if scenario == "hybrid":  # the shipped VLM program, told the ViT-2B's cost
        raw["strategy"] = {"file": str(REPO / "configs" / "strategies" / "vlm.py"),
                           "options": {"encoder_b": VIT_2B.b / VIT_2B.a}}
    path = workdir / f"{scenario}-{ranks}-{context}.yaml"
    path.write_text(yaml.safe_dump(raw))
    if scenario == "hybrid":
        return load_strategy(load_config(path))
    s = Strategy(load_config(path))
    if scenario == "backbone":
        s.cost("attention").distribute("DP").balance("greedy")
    return s.plan()


def picks_of(samples: list[Drawn], step: int):
    from flight_overlord.core.order import SampleRef
    from flight_overlord.planner.feed import Pick
    return [Pick(SampleRef(f"s{d.source}", 0, "f", step, i), d.tokens, sum(d.image_patches), d.image_patches)
            for i, d in enumerate(samples)]


def bin_seconds(bin_picks: list, own_images: bool) -> float:
    """One packed microbatch on the backbone, plus the ViT over its samples' images when they stay with it."""
    vit = VIT_2B.seconds([n for p in bin_picks for n in p.image_sizes]) if own_images else 0.0
    return LLM_12B.seconds([p.tokens for p in bin_picks]) + vit


@dataclass
class StepLoad:
    """One step's simulated seconds per rank, backbone and encoder apart. With an image graph
    (``phases``) a rank's images belong to other ranks' sequences: the embeddings' all-to-all
    separates the two phases, so each waits for its own slowest rank; without it a rank runs its
    own images then its own sequences, and only the step's end is a barrier."""
    backbone: np.ndarray
    encoder: np.ndarray
    phases: bool
    floor: float  # no placement of these samples finishes sooner (each sample or image is atomic)

    @property
    def seconds(self) -> float:
        if self.phases:
            return float(self.encoder.max() + self.backbone.max())
        return float((self.encoder + self.backbone).max())

    @property
    def imbalance(self) -> float:
        return self.seconds / float((self.encoder + self.backbone).mean())


def step_load(bins: list, encoder, ranks: int, microbatches: int) -> tuple[StepLoad, np.ndarray]:
    """The step's ``StepLoad`` and each microbatch's seconds (with its own images when no graph)."""
    per_bin = np.array([bin_seconds(b, encoder is None) for b in bins])
    backbone = per_bin.reshape(ranks, microbatches).sum(axis=1)
    picks = [p for b in bins for p in b]
    llm = np.array([LLM_12B.seconds([p.tokens]) for p in picks] or [0.0])
    vit = np.array([VIT_2B.seconds([n]) for p in picks for n in p.image_sizes] or [0.0])
    if encoder is None:
        own = np.array([VIT_2B.seconds(list(p.image_sizes)) for p in picks] or [0.0])
        floor = max(backbone.mean(), float((llm + own).max()))
        return StepLoad(backbone, np.zeros(ranks), False, floor), per_bin
    encoded = np.array([VIT_2B.seconds([p.image_sizes[i] for p, i in units]) for units in encoder])
    floor = max(backbone.mean(), float(llm.max())) + max(encoded.mean(), float(vit.max()))
    return StepLoad(backbone, encoded, True, floor), per_bin


def pack_in_order(picks: list, capacity: int) -> list[list]:
    """A conventional packer: microbatches of ``capacity`` tokens filled in arrival order, as many as needed."""
    bins, used = [[]], 0
    for p in picks:
        if bins[-1] and used + p.tokens > capacity:
            bins.append([])
            used = 0
        bins[-1].append(p)
        used += p.tokens
    return bins


def equal_samples_seconds(picks: list, ranks: int, capacity: int) -> np.ndarray:
    """``vanilla-samples``: every rank the same number of samples (in arrival order), packed into
    as many microbatches as its tokens need; each rank encodes its own samples' images."""
    out = np.zeros(ranks)
    for rank, idx in enumerate(np.array_split(np.arange(len(picks)), ranks)):
        out[rank] = sum(bin_seconds(mb, True) for mb in pack_in_order([picks[i] for i in idx], capacity))
    return StepLoad(out, np.zeros(ranks), False, math.nan)


def plan_seconds(strategy, picks: list, step: int, ranks: int, microbatches: int):
    """The Planner's placement of one step's picks: (``StepLoad``, per-microbatch seconds, placed
    tokens, indices of the picks left for the next step)."""
    from flight_overlord.planner.picks import PickTable
    from flight_overlord.planner.program import PlanContext, place, place_images, sample_meta
    table = PickTable.from_picks(list(dict.fromkeys(p.ref.source for p in picks)), picks)
    meta = sample_meta(table)
    ctx = PlanContext(step, table, meta, np.asarray(strategy.cost_fn(meta), dtype=np.float64),
                      strategy.num_buckets, microbatches, strategy.capacity, strategy.mesh)
    bins_idx, unplaced = place(ctx, strategy)
    bins = [[picks[i] for i in idx] for idx in bins_idx]
    encoder = place_images(bins, strategy)[0] if strategy.image_graph is not None else None
    load, per_bin = step_load(bins, encoder, ranks, microbatches)
    return load, per_bin, sum(p.tokens for b in bins for p in b), unplaced


def simulate(workload: str, scenario: str, ranks: int, context: int, microbatches: int, steps: int,
             fill: float, seed: int, sources: int | None, workdir: Path) -> dict:
    """Run ``steps`` steps; tokens/s of the simulated accelerators, step time over the mean rank's
    and over the floor (``StepLoad.floor``), and the worst microbatch over the mean one."""
    placement = "vanilla" if scenario == EQUAL_SAMPLES else scenario
    strategy = make_strategy(placement, ranks, context, microbatches, workdir)
    stream = SampleStream(workload, context, seed, sources)  # same seed: every scenario sees the same draws
    budget = fill * ranks * microbatches * context
    carried: list[Drawn] = []
    tokens, seconds, imbalance, over_floor, worst_bin = 0, 0.0, [], [], []
    for step in range(steps):
        samples, total = list(carried), sum(d.tokens for d in carried)
        while total < budget:
            samples.append(stream.draw())
            total += samples[-1].tokens
        picks = picks_of(samples, step)
        if scenario == EQUAL_SAMPLES:
            load, placed, carried = equal_samples_seconds(picks, ranks, context), total, []
        else:
            load, per_bin, placed, unplaced = plan_seconds(strategy, picks, step, ranks, microbatches)
            carried = [samples[i] for i in unplaced]
            busy = per_bin[per_bin > 0]
            worst_bin.append(float(busy.max() / busy.mean()))
        tokens += placed
        seconds += load.seconds
        imbalance.append(load.imbalance)
        over_floor.append(load.seconds / load.floor)
    return {"tokens_per_s": tokens / seconds, "imbalance": float(np.mean(imbalance)), "step_s": seconds / steps,
            "over_floor": float(np.mean(over_floor)), "worst_bin": float(np.mean(worst_bin)) if worst_bin else math.nan}


def run(args) -> dict:
    """Every (context, ranks, scenario) of ``args``; prints the table and the headline lines."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="vlm-workload-") as tmp:
        for context in args.contexts:
            for ranks in args.model_ranks:
                for scenario in SCENARIOS + ((EQUAL_SAMPLES,) if args.equal_samples else ()):
                    results[(context, ranks, scenario)] = simulate(
                        args.workload, scenario, ranks, context, args.microbatches, args.model_steps, args.fill,
                        args.seed, args.sources, Path(tmp))
    report(results, args)
    return results


def corpus_stats(workload: str, context: int, seed: int, sources: int | None, n: int = 20000) -> str:
    """What the step draws look like: sample tokens, image share, patches per image (n draws)."""
    stream = SampleStream(workload, context, seed + 1, sources)
    drawn = [stream.draw() for _ in range(n)]
    tokens = np.array([d.tokens for d in drawn])
    patches = np.array([p for d in drawn for p in d.image_patches])
    merge = stream.spec.merge_size ** 2
    image_tokens = patches.sum() / merge + 2 * len(patches)
    q = np.percentile(tokens, [50, 90, 99])
    long = tokens >= context / 4
    return (f"sample tokens mean {tokens.mean():.0f}, p50 {q[0]:.0f}, p90 {q[1]:.0f}, p99 {q[2]:.0f}, "
            f"max {tokens.max()}; {long.mean():.1%} of samples >= context/4 holding "
            f"{tokens[long].sum() / tokens.sum():.0%} of tokens; image tokens {image_tokens / tokens.sum():.0%}; "
            f"{len(patches) / n:.2f} images per sample, patches per image p50 {np.percentile(patches, 50):.0f}, "
            f"p99 {np.percentile(patches, 99):.0f}, max {patches.max()}")


def cost_ceiling(workload: str, context: int) -> float:
    """The most a token of a packed microbatch can cost over the least, under these cost models: one
    ``context``-long sequence made of the largest images the vision spec allows (each ViT-2B patch
    in an image of the maximum patch count) vs short text (the linear term only). A token-packed
    Vanilla's slowest rank is at most this over a perfectly balanced rank (whatever the data)."""
    v = VISION[workload]
    most_patches = v["max_pixels"] // v["patch_size"] ** 2
    per_image_token = v["merge_size"] ** 2 * (VIT_2B.a + VIT_2B.b * most_patches)
    return (LLM_12B.a + LLM_12B.b * context + per_image_token) / LLM_12B.a


def describe_models() -> list[str]:
    return [f"simulated accelerator: {TFLOPS / 1e12:.0f} TFLOP/s at {MFU:.0%} MFU = {FLOPS / 1e12:.0f} TFLOP/s",
            f"- {LLM_12B.describe()}; FLOP/token {6 * LLM_12B.params:.3g} + {12 * LLM_12B.layers * LLM_12B.hidden:.3g} "
            f"per (token, token of its sequence)",
            f"- {VIT_2B.describe()}; FLOP/patch {6 * VIT_2B.params:.3g} + {12 * VIT_2B.layers * VIT_2B.hidden:.3g} "
            f"per (patch, patch of its image)"]


def speedup(results: dict, context: int, ranks: int, scenario: str = "hybrid") -> float:
    return results[(context, ranks, scenario)]["tokens_per_s"] / results[(context, ranks, "vanilla")]["tokens_per_s"]


def report(results: dict, args) -> None:
    for line in describe_models():
        print(line)
    print(f"workload {args.workload} ({args.sources or 306 if args.workload == 'navit' else 5} sources), "
          f"{args.microbatches} microbatches per rank, step budget {args.fill:.0%} of capacity, "
          f"{args.model_steps} planned steps, seed {args.seed}")
    print()
    print("| context | ranks | vanilla tokens/s | backbone | hybrid | backbone/vanilla | hybrid/vanilla "
          "| paper (avg) | step / mean rank time: vanilla, backbone, hybrid | hybrid step / floor "
          "| vanilla worst/mean microbatch |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for context in args.contexts:
        for ranks in args.model_ranks:
            r = [results[(context, ranks, s)] for s in SCENARIOS]
            print(f"| {context // 1024}K | {ranks} | {r[0]['tokens_per_s']:,.0f} | {r[1]['tokens_per_s']:,.0f} | "
                  f"{r[2]['tokens_per_s']:,.0f} | {speedup(results, context, ranks, 'backbone'):.2f}x | "
                  f"{speedup(results, context, ranks):.2f}x | {PAPER.get(context, math.nan):.2f}x | "
                  + ", ".join(f"{x['imbalance']:.2f}" for x in r)
                  + f" | {r[2]['over_floor']:.2f} | {r[0]['worst_bin']:.2f} |")
    if any(k[2] == EQUAL_SAMPLES for k in results):
        print()
        print(f"| context | ranks | {EQUAL_SAMPLES} tokens/s | its max/mean rank time | hybrid / {EQUAL_SAMPLES} |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        for context in args.contexts:
            for ranks in args.model_ranks:
                r = results[(context, ranks, EQUAL_SAMPLES)]
                print(f"| {context // 1024}K | {ranks} | {r['tokens_per_s']:,.0f} | {r['imbalance']:.2f} | "
                      f"{results[(context, ranks, 'hybrid')]['tokens_per_s'] / r['tokens_per_s']:.2f}x |")
    print()
    for context in args.contexts:
        print(f"- corpus at {context // 1024}K: {corpus_stats(args.workload, context, args.seed, args.sources)}")
    print()
    top = max(args.model_ranks)
    for context in args.contexts:
        print(f"speedup vs vanilla at {context // 1024}K: {speedup(results, context, top):.2f}x "
              f"({top} ranks; paper {PAPER.get(context, math.nan):.2f}x; cost-model ceiling for a token-packed "
              f"vanilla {cost_ceiling(args.workload, context):.2f}x)")


def plot(results: dict, args, path: Path, end_to_end: dict | None = None) -> None:
    from benchmarks.common.benchlib import pyplot, save_plot
    plt = pyplot(path)
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(args.contexts))
    series = [(f"hybrid, {r} ranks (planned)", [speedup(results, c, r) for c in args.contexts])
              for r in args.model_ranks]
    if end_to_end:
        series.insert(0, (f"hybrid, {args.cluster_ranks} ranks end to end", [end_to_end[c] for c in args.contexts]))
    series.append(("paper (Fig. 13 average)", [PAPER.get(c, math.nan) for c in args.contexts]))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series):
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label,
                      color="0.3" if label.startswith("paper") else None)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(x, [f"{c // 1024}K" for c in args.contexts])
    ax.set_ylabel("throughput vs Vanilla")
    ax.set_title(f"{args.workload}: hybrid balance vs Vanilla (Llama-12B + ViT-2B cost model)")
    ax.axhline(1.0, color="k", lw=0.5)
    ax.legend(fontsize=7)
    save_plot(fig, path)


def add_arguments(p) -> None:
    """The options of ``benchmarks.training.end_to_end`` for ``--workload``."""
    g = p.add_argument_group("--workload navit|coyo (the paper's VLM setting, planned in-process; "
                             "see benchmarks/training/vlm_workload.py)")
    g.add_argument("--workload", choices=("navit", "coyo"), help="run the paper's VLM setting instead of --scenarios")
    g.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), help="context lengths (default 4096,8192,16384)")
    g.add_argument("--model-ranks", default="8,64,256", help="simulated data-parallel ranks (default 8,64,256)")
    g.add_argument("--model-steps", type=int, default=20, help="planned steps per case (default 20; "
                   "--steps and --warmup are the end-to-end runs')")
    g.add_argument("--microbatches", type=int, default=4, help="microbatches per rank and step (default 4)")
    g.add_argument("--fill", type=float, default=0.9, help="step token budget over the ranks' capacity (default 0.9)")
    g.add_argument("--sources", type=int, default=None, help="navit sources (default 306)")
    g.add_argument("--equal-samples", action="store_true",
                   help=f"also the {EQUAL_SAMPLES} baseline (same sample count per rank, microbatches as needed)")
    g.add_argument("--seed", type=int, default=0, help="corpus and draw seed (default 0)")
    g.add_argument("--cluster-ranks", type=int, default=8,
                   help="trainer ranks of the end-to-end runs on a LocalCluster (default 8; 0: planned only)")
    g.add_argument("--cluster-rows", type=int, default=200, help="rows per source of the corpus written (default 200)")
    g.add_argument("--cluster-step-seconds", type=float, default=2.0,
                   help="wall seconds of a mean simulated step in the end-to-end runs (sets the time scale; default 2)")
    g.add_argument("--workload-plot", type=Path, default=None,
                   help="plot path (default docs/vlm_<workload>_speedup.png)")


def check_arguments(p, args) -> None:
    try:
        args.contexts = [int(x) for x in str(args.contexts).split(",") if x.strip()]
        args.model_ranks = [int(x) for x in str(args.model_ranks).split(",") if x.strip()]
    except ValueError:
        p.error("--contexts and --model-ranks take comma-separated integers")
    if not args.contexts or not args.model_ranks or min(args.contexts + args.model_ranks) < 1:
        p.error("--contexts and --model-ranks need positive integers")
    bad_sources = args.sources is not None and args.sources < 1
    if min(args.model_steps, args.microbatches) < 1 or not 0 < args.fill <= 1 or bad_sources:
        p.error("--model-steps, --microbatches and --sources must be >= 1, --fill in (0, 1]")
    if args.cluster_ranks < 0 or args.cluster_rows < 8 or not args.cluster_step_seconds > 0:
        p.error("--cluster-ranks must be >= 0, --cluster-rows >= 8, --cluster-step-seconds > 0")
