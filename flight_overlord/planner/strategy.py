"""The orchestration program, declared with a handful of primitives (the paper's DGraph, section 4).

    def build(s):                                  # a strategy file the YAML names: `strategy: my.py`
        return (s.mix(linear(SHORT, LONG, start=0, end=2000))
                 .cost("attention")
                 .distribute("DP")
                 .balance("greedy", level="both")
                 .broadcast_at("TP"))

Every primitive has a default taken from the config (``sources[].weight``, ``cost``,
``balance.method``), so a config without a strategy file plans exactly as before. ``plan_raw``
replaces distribute+balance with a user function when the primitives cannot express a strategy.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import Config, ConfigError, balance_methods
from ..core import hdp
from ..core.cost import CostFn, config_cost, make_cost, patches_cost
from ..core.mesh import BROADCAST_DIMS, DISTRIBUTE_AXES, Mesh
from ..core.run_shape import BatchSchedule, by_stage, checked_stages, context_stage, stage_at
from ..core.schedules import Schedule, as_schedule, constant
from ..core.stages import StageContents

BALANCE_LEVELS = ("both", "inter", "intra")
@dataclass
class Balancing:
    method: str
    level: str = "both"            # inter: across buckets; intra: across a bucket's microbatches
    keep_global_batch: bool = False  # True: every sample drawn for a step is trained in that step
    equal_size: bool = False  # True: every bin gets the same number of samples (counts differ by <= 1)


@dataclass
class ImageGraph:
    """The vision encoder's view of the same samples (the paper's second DGraph): each sample's
    images go to one encoder bucket, balanced by their own cost, independently of where the
    sample's sequence goes; trainers exchange the embeddings (all-to-all) before the backbone."""
    cost_fn: CostFn
    axis: str = "WORLD"
    method: str = "karmarkar_karp"
    cost_params: dict | None = None  # the patches model's a, b when named so (the prior of cost.fit_encoder)

    def cost(self, fn="patches", **params) -> "ImageGraph":
        self.cost_fn = fn if callable(fn) else _image_cost(fn, params)
        self.cost_params = None if callable(fn) else {"a": params.get("a", 1.0), "b": params.get("b", 0.0)}
        return self

    def distribute(self, axis: str = "WORLD") -> "ImageGraph":
        if axis not in DISTRIBUTE_AXES or axis == "HDP":
            raise ValueError(f"images().distribute(): unknown axis {axis!r} (axes: {', '.join(DISTRIBUTE_AXES)})")
        self.axis = axis
        return self

    def balance(self, method: str = "karmarkar_karp") -> "ImageGraph":
        if method not in balance_methods():
            raise ValueError(f"images().balance(): unknown method {method!r} (methods: {', '.join(balance_methods())})")
        self.method = method
        return self


def _image_cost(name: str, params: dict) -> CostFn:
    if name != "patches":
        raise ValueError(f"images().cost(): unknown cost model {name!r} (built-in: patches; or pass a function)")
    return patches_cost(**params)


class Strategy:
    """The primitives; each returns the strategy, so a program reads as one chained expression."""

    def __init__(self, cfg: Config, mesh: Mesh | None = None):
        self.cfg = cfg
        self.mesh = mesh or cfg.mesh
        self.sources = [s.name for s in cfg.sources]
        self.schedule: Schedule = constant({s.name: s.weight for s in cfg.sources})
        self.cost_fn: CostFn = config_cost(cfg.cost)
        # the attention model's coefficients when named so (the prior of cost.fit); None for other models
        self.cost_params: dict | None = {"a": cfg.cost.a, "b": cfg.cost.b} if cfg.cost.model == "attention" else None
        self.axis, self.group_size = "DP", None
        self.hdp_tokens: int | None = None  # distribute("HDP"): max_tokens_per_rank (None: context_length // cp)
        self.min_cp, self.hdp_widen = 1, True
        self.balancing = Balancing(cfg.balance.method)
        self.broadcast: frozenset[str] = frozenset()
        self.silent: frozenset[str] = frozenset()  # broadcast dimensions whose ranks above 0 never read
        self.stage_contents = StageContents()
        self.raw: Callable | None = None
        self.image_graph: ImageGraph | None = None
        self.buffer_policy: Callable | None = None
        self.constructor_policy: Callable | None = None
        self.batch_schedule: BatchSchedule | None = cfg.schedule.batch  # None: global_batch's size every step
        # context-length stages (not pipeline stages): empty, global_batch's shape every step
        self.context_stages: tuple[context_stage, ...] = cfg.schedule.context

    def images(self) -> ImageGraph:
        """The image graph: ``s.images().cost("patches").distribute("WORLD").balance("karmarkar_karp")``.
        Without it, a sample's pixels travel with its sequence to its data-parallel bucket."""
        if self.image_graph is None:
            self.image_graph = ImageGraph(patches_cost(), cost_params={"a": 1.0, "b": 0.0})
        return self.image_graph

    def mix(self, schedule) -> "Strategy":
        """Source weights per step: a schedule, a mapping of constant weights, or a callable of the step."""
        self.schedule = as_schedule(schedule)
        return self

    def batch(self, schedule: BatchSchedule) -> "Strategy":
        """The global batch per step (``batch_ramp``, ``batch_steps``), in global_batch's unit."""
        if not isinstance(schedule, BatchSchedule):
            raise ValueError(f"batch(): expected batch_ramp(...) or batch_steps(...), got {schedule!r}")
        self.batch_schedule = schedule
        return self

    def context(self, *stages: context_stage) -> "Strategy":
        """Context-length stages (``context_stage(first_step, context_length, microbatches, weights)``)."""
        if not all(isinstance(stage, context_stage) for stage in stages):
            raise ValueError("context(): expected context_stage(...) arguments")
        self.context_stages = checked_stages(stages)
        return self

    def cost(self, fn="attention", **params) -> "Strategy":
        """A registered cost model by name (``"tokens"``, ``"attention"`` with a, b defaulting to the
        config's, ``"patches"``, or one of yours), or any function of the sample metadata arrays
        returning one cost per sample."""
        self.cost_params = None
        if callable(fn):
            self.cost_fn = fn
        else:
            if fn == "attention":
                params = {"a": self.cfg.cost.a, "b": self.cfg.cost.b, **params}
                self.cost_params = {"a": params["a"], "b": params["b"]}
            self.cost_fn = make_cost(fn, **params)
        return self

    def distribute(self, axis: str = "DP", group_size: int | None = None, *,
                   max_tokens_per_rank: int | None = None, min_cp: int = 1, widen: bool = True) -> "Strategy":
        """Buckets along ``axis``: DP ranks, DP x CP ranks, or every rank (WORLD). With ``group_size``
        the buckets are balanced within groups of that many instead of all at once.

        ``"HDP"``: dynamic CP groups over the DP x CP ranks (``core/hdp.py``): each sample gets a
        power-of-two group of ranks from its length (at least ``min_cp``), each rank holds at most
        ``max_tokens_per_rank`` tokens per microbatch (default context_length // cp); ``widen`` doubles
        the group of a sample whose work per rank would exceed a rank's fair share of a microbatch."""
        if axis not in DISTRIBUTE_AXES:
            raise ValueError(f"distribute(): unknown axis {axis!r} (axes: {', '.join(DISTRIBUTE_AXES)})")
        if group_size is not None and group_size < 1:
            raise ValueError(f"distribute(): group_size must be >= 1, got {group_size}")
        if axis != "HDP" and (max_tokens_per_rank is not None or min_cp != 1 or widen is not True):
            raise ValueError(f"distribute({axis!r}): max_tokens_per_rank, min_cp and widen apply to 'HDP' only")
        if not isinstance(widen, bool):
            raise ValueError(f"distribute('HDP'): widen must be true or false, got {widen!r}")
        if axis == "HDP":
            if group_size is not None:
                raise ValueError("distribute('HDP'): group_size does not apply (groups are planned per sample)")
            hdp.check_params(1 << 62, 1 if max_tokens_per_rank is None else max_tokens_per_rank, min_cp)
        self.axis, self.group_size = axis, group_size
        self.hdp_tokens, self.min_cp, self.hdp_widen = max_tokens_per_rank, min_cp, widen
        return self

    def balance(self, method: str = "karmarkar_karp", level: str = "both",
                keep_global_batch: bool = False, equal_size: bool = False) -> "Strategy":
        if method not in balance_methods():
            raise ValueError(f"balance(): unknown method {method!r} (methods: {', '.join(balance_methods())})")
        if level not in BALANCE_LEVELS:
            raise ValueError(f"balance(): unknown level {level!r} (levels: {', '.join(BALANCE_LEVELS)})")
        self.balancing = Balancing(method, level, keep_global_batch, equal_size)
        return self

    def broadcast_at(self, dim: str, others_read: bool = True) -> "Strategy":
        """The trainer broadcasts along ``dim`` itself: only its rank 0 there receives tokens; the
        others get metadata. ``others_read=False``: those others never read at all (Megatron-Core calls
        ``next()`` on TP rank 0 only), so the constructors do not keep steps for them."""
        if dim not in BROADCAST_DIMS:
            raise ValueError(f"broadcast_at(): unknown dimension {dim!r} (dimensions: {', '.join(BROADCAST_DIMS)})")
        if not isinstance(others_read, bool):
            raise ValueError(f"broadcast_at({dim!r}): others_read must be true or false, got {others_read!r}")
        self.broadcast = self.broadcast | {dim}
        if not others_read:
            self.silent = self.silent | {dim}
        return self

    def pipeline_stages(self, first=None, middle=None, last=None) -> "Strategy":
        """The token fields each pipeline stage receives (of ``input_ids``, ``position_ids``,
        ``labels``, ``loss_mask``, ``pixel_values``); a stage not named keeps the default, what
        Megatron-Core's stages read: the first ``input_ids``, ``position_ids`` and ``pixel_values``, the
        last ``labels`` and ``loss_mask``, the middle ones none. Every stage gets the sequence
        boundaries and sample keys."""
        self.stage_contents = StageContents.of(first, middle, last)
        return self

    def plan_raw(self, fn: Callable) -> "Strategy":
        """Low-level hook: ``fn(ctx: PlanContext) -> (bins, unplaced)`` places the drawn samples itself."""
        self.raw = fn
        return self

    def summary_buffer(self, fn: Callable) -> "Strategy":
        """Low-level hook: ``fn(step, summary, weights) -> weights`` adjusts the step's mixture from
        a summary of what is waiting per source (``{source: {"deferred", "deferred_tokens",
        "drawn"}}``), e.g. to drain a backlog of long samples that keep being deferred."""
        self.buffer_policy = fn
        return self

    def constructor_do_plan(self, fn: Callable) -> "Strategy":
        """Low-level hook run by the Data Constructors: ``fn(step, bucket, microbatches) -> order``,
        a permutation of ``range(len(microbatches))`` giving the order in which a bucket's
        microbatches are delivered (each microbatch: its sample keys and real token count)."""
        self.constructor_policy = fn
        return self

    def plan(self) -> "Strategy":
        """Check the program against the mesh; the Planner calls this before the first step."""
        if self.axis == "WORLD" and self.broadcast:
            raise ValueError("broadcast_at() does not apply under distribute('WORLD'): every rank is its own consumer")
        if self.axis == "CP" and "CP" in self.broadcast:
            raise ValueError("broadcast_at('CP') contradicts distribute('CP') (CP ranks consume distinct data)")
        if self.constructor_policy is not None and self.image_graph is not None:
            raise ValueError("constructor_do_plan() cannot reorder microbatches under images(): the encoder "
                             "streams name their owner microbatch by its planned position")
        if self.group_size and self.num_buckets % self.group_size:
            raise ValueError(f"distribute({self.axis!r}, group_size={self.group_size}): the group size must divide "
                             f"the {self.num_buckets} buckets of this mesh")
        if self.axis == "HDP":
            self._check_hdp()
        if self.cfg.cost.fit or self.cfg.cost.fit_encoder:
            self._check_fit()
        if self.capacity < 1:
            raise ValueError(f"distribute({self.axis!r}): context_length {self.cfg.global_batch.context_length} "
                             f"over cp={self.mesh.cp} leaves no room per microbatch")
        if self.context_stages:
            self._check_stages()
            staged = any(stage.weights is not None for stage in self.context_stages)
            if staged and not isinstance(self.schedule, by_stage):
                self.schedule = by_stage(self.schedule, self.context_stages)
        return self

    def _check_stages(self) -> None:
        """A stage's sequences fit what the loaders cut (context_length), split evenly under CP."""
        longest, multiple = self.cfg.global_batch.context_length, max(self.seq_multiple, self.mesh.cp)
        for i, stage in enumerate(self.context_stages):
            where = f"schedule.context[{i}] (from step {stage.first_step})"
            if self.axis == "HDP":
                raise ValueError(f"{where}: context stages cannot be combined with distribute('HDP')")
            if stage.context_length > longest:
                raise ValueError(f"{where}: context_length {stage.context_length} is over global_batch.context_length "
                                 f"{longest}, where the loaders cut samples: raise global_batch.context_length")
            if stage.context_length % multiple:
                raise ValueError(f"{where}: context_length {stage.context_length} must be a multiple of {multiple} "
                                 f"(cp={self.mesh.cp})")
        unknown = sorted({s for stage in self.context_stages for s in (stage.weights or {})} - set(self.sources))
        if unknown:
            raise ValueError(f"schedule.context: weights name unknown source {unknown[0]!r} (sources: "
                             f"{', '.join(self.sources)})")

    def batch_at(self, step: int) -> int:
        """The step's global batch, in samples or tokens (global_batch's unit)."""
        gb = self.cfg.global_batch
        if self.batch_schedule is not None:
            return self.batch_schedule.at(step)
        return gb.tokens_per_step if gb.tokens_per_step is not None else gb.samples_per_step

    def microbatches_at(self, step: int) -> int:
        stage = stage_at(self.context_stages, step)
        return self.cfg.global_batch.microbatches if stage is None else stage.microbatches

    def capacity_at(self, step: int) -> int:
        """A bucket's tokens per microbatch at ``step``: its stage's context length (over cp under axis CP)."""
        stage = stage_at(self.context_stages, step)
        if stage is None:
            return self.capacity
        return stage.context_length // self.mesh.cp if self.axis == "CP" else stage.context_length

    def max_sample_tokens_at(self, step: int) -> int:
        return self.max_sample_tokens if stage_at(self.context_stages, step) is None else self.capacity_at(step)

    def shape(self) -> dict:
        """The schedules of the run's shape, as data (part of the layout; empty without them)."""
        shape = {}
        if self.batch_schedule is not None:
            shape["batch"] = self.batch_schedule.describe()
        if self.context_stages:
            shape["context"] = [stage.describe() for stage in self.context_stages]
        return shape

    def _check_fit(self) -> None:
        """cost.fit fits the attention model's a and b, over the buckets' planned microbatches."""
        if self.cost_params is None:
            raise ValueError("cost.fit: true fits the 'attention' model (a*l + b*l^2); this run's cost is "
                             "another model or a function")
        if self.axis == "HDP":
            raise ValueError("cost.fit: true cannot be combined with distribute('HDP'): a rank's timing is read "
                             "against its bucket's planned microbatches, and an HDP sample spans ranks")
        if self.cost_params["a"] <= 0 and self.cost_params["b"] <= 0:
            raise ValueError("cost.fit: true needs a prior with a positive coefficient (cost.a or cost.b)")
        if self.cfg.cost.fit_encoder and not self.cfg.cost.fit:
            raise ValueError("cost.fit_encoder: true goes with cost.fit: true (both models are fitted, or none)")
        if self.cfg.cost.fit_encoder and (self.image_graph is None or self.image_graph.cost_params is None):
            raise ValueError("cost.fit_encoder: true fits the image graph's 'patches' model: the strategy needs "
                             "images().cost('patches', ...)")

    def _check_hdp(self) -> None:
        """What distribute('HDP') cannot be combined with, and a domain too small for the loaders' limit."""
        clashes = [("broadcast_at('CP')", "CP" in self.broadcast), ("plan_raw()", self.raw is not None),
                   ("constructor_do_plan()", self.constructor_policy is not None),
                   ("images()", self.image_graph is not None),
                   ("image-text sources", any(s.image_column for s in self.cfg.sources))]
        for what, present in clashes:
            if present:
                raise ValueError(f"distribute('HDP') cannot be combined with {what}: a sample's group spans "
                                 f"ranks and microbatch positions fixed by the plan (text sources only)")
        domain = self.num_buckets
        hdp.check_params(domain, self.capacity, self.min_cp)
        length = self.cfg.global_batch.context_length
        if length > hdp.longest_sample(domain, self.capacity):
            raise ValueError(f"distribute('HDP'): samples up to context_length {length} tokens do not fit the "
                             f"{domain}-rank DP x CP domain at max_tokens_per_rank {self.capacity} (at most "
                             f"{hdp.longest_sample(domain, self.capacity)} per microbatch): raise max_tokens_per_rank")

    @property
    def max_sample_tokens(self) -> int:
        """The longest sample a step plans whole (longer ones are planned truncated to it): a
        microbatch's capacity, or under HDP the loaders' limit (context_length; never truncated)."""
        return self.cfg.global_batch.context_length if self.axis == "HDP" else self.capacity

    @property
    def num_buckets(self) -> int:
        return self.mesh.num_buckets(self.axis)

    @property
    def seq_multiple(self) -> int:
        """Each sequence's slot is a multiple of this: 2*cp when packed sequences are split across CP
        ranks in the THD layout (each padded and split on its own), else 1."""
        mesh = self.cfg.mesh
        splits = self.axis == "DP" and mesh.cp > 1 and "CP" not in self.broadcast
        return 2 * mesh.cp if splits and mesh.cp_format == "thd" else 1

    @property
    def capacity(self) -> int:
        """Tokens per packed microbatch of one bucket: under axis CP a rank holds 1/cp of the context."""
        length = self.cfg.global_batch.context_length
        if self.axis == "HDP":
            return self.hdp_tokens or length // self.mesh.cp
        return length // self.mesh.cp if self.axis == "CP" else length


def load_strategy(cfg: Config, mesh: Mesh | None = None) -> Strategy:
    """The config's strategy: defaults, then the strategy file's ``build(s)`` if the config names one."""
    strategy = Strategy(cfg, mesh)
    if cfg.strategy is None:
        return strategy.plan()
    path, function = cfg.strategy.file, cfg.strategy.function
    module = _import_file(path)
    build = getattr(module, function, None)
    if not callable(build):
        raise ConfigError(f"strategy file {path}: defines no function {function!r}")
    try:
        result = build(strategy, **cfg.strategy.options)
        return (result if isinstance(result, Strategy) else strategy).plan()
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"strategy file {path}: {function}(): {exc}") from None


def _import_file(path: Path):
    spec = importlib.util.spec_from_file_location(f"overlord_strategy_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except FileNotFoundError:
        raise ConfigError(f"strategy file not found: {path}") from None
    except SyntaxError as exc:
        raise ConfigError(f"strategy file {path}: line {exc.lineno}: {exc.msg}") from None
    return module
