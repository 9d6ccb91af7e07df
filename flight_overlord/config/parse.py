"""Reading and validating a config: YAML in, the typed sections of ``model.py`` out.

Every error names the offending key (as a path like ``sources[2].weight``) or file,
because a config is the first thing a user gets wrong.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from ..core import balance
from ..core.context_parallel import CP_FORMATS, CP_SPLITS, chunk_count
from ..core.cost import COST_MODELS
from ..core.mesh import Mesh
from .fields import REQUIRED, as_choice, as_flag, as_int, as_number, check_host, check_keys, defaults_of
from .model import (
    BalanceConfig,
    CheckpointConfig,
    Config,
    ConfigError,
    ConstructorConfig,
    CostConfig,
    GlobalBatchConfig,
    LivenessConfig,
    LoaderConfig,
    MetricsConfig,
    NetworkConfig,
    PartitionBudget,
    PlannerConfig,
    RayConfig,
    ScalingConfig,
    SecurityConfig,
    StrategyConfig,
    TLSConfig,
    VisionConfig,
    deployment_defaults,
)
from .plugins import import_plugins
from .shape import shape_keys
from .sources import parse_sources
from .sources import relative_path as _path

MESH_KEYS = {k: v for k, v in defaults_of(Mesh).items() if k != "dp_per_constructor"}  # its own section's


def balance_methods() -> tuple[str, ...]:
    """The registered balancers, and "none" (samples in arrival order)."""
    return (*balance.METHODS, "none")


def load_config(path: str | os.PathLike, *, expand_files: bool = True) -> Config:
    """Read and validate a YAML config file. Relative paths are relative to the file's folder.
    ``expand_files=False``: the sources' globs are expanded only when their files are asked for
    (``sources.SourcePaths``): the Planner and the constructors need only the catalogs, by digest."""
    path = Path(path).resolve()
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return with_partition_plan(parse_config(raw, base_dir=path.parent, path=path, expand_files=expand_files))


def with_partition_plan(cfg: Config) -> Config:
    """``loader.partition: auto``: the config with ``run_dir/partition/plan.json`` applied (actors per
    source, loader hosts), so every role of the run sees the same plan; as written until there is one."""
    if cfg.loader.partition != "auto":
        return cfg
    from ..core.partition_plan import PartitionPlan, apply_plan
    path = cfg.run_dir / "partition" / "plan.json"
    if not path.is_file():
        return cfg
    try:
        return apply_plan(cfg, PartitionPlan.from_dict(json.loads(path.read_text(encoding="utf-8"))))
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: cannot apply the partition plan: {exc}") from None


def parse_config(raw: Any, *, base_dir: Path, path: Path | None = None, expand_files: bool = True) -> Config:
    top = check_keys(raw, "", {
        "seed": 0, "data_root": ".", "run_dir": "runs/default", "sources": REQUIRED,
        "mesh": None, "global_batch": REQUIRED, "cost": None, "balance": None,
        "prefetch": 2, "network": None, "loader": None, "constructor": None,
        "pad_token_id": 0, "strategy": None, "vision": None, "checkpoint": None, "security": None,
        "metrics": None, "ray": None, "planner": None, "deployment": "default", "plugins": None, "liveness": None,
        "skip": None, "schedule": None,
    })
    plugins = import_plugins(top["plugins"], base_dir)  # first: they may register what the rest names
    data_root = _path(base_dir, top["data_root"], "data_root")
    global_batch = _parse_global_batch(top["global_batch"])
    sources = parse_sources(top["sources"], data_root, expand_files=expand_files)
    network = check_keys(top["network"], "network", defaults_of(NetworkConfig))
    balancing = check_keys(top["balance"], "balance", defaults_of(BalanceConfig))
    role_defaults = deployment_defaults(top["deployment"], top["mesh"])
    loader, constructor = (check_keys(top[k], k, keys) for k, keys in zip(("loader", "constructor"), role_defaults))
    checkpoint = check_keys(top["checkpoint"], "checkpoint", defaults_of(CheckpointConfig))
    dp_per_constructor = as_int(constructor["dp_per_constructor"], "constructor.dp_per_constructor", minimum=1)
    mesh = _parse_mesh(top["mesh"], global_batch.context_length, global_batch.pad_to_multiple, dp_per_constructor)
    planner = check_keys(top["planner"], "planner", defaults_of(PlannerConfig))
    return Config(
        seed=as_int(top["seed"], "seed", minimum=0),
        sources=sources,
        mesh=mesh,
        global_batch=global_batch,
        cost=_parse_cost(top["cost"]),
        balance=BalanceConfig(as_choice(balancing["method"], "balance.method", balance_methods())),
        prefetch=as_int(top["prefetch"], "prefetch", minimum=1),
        network=NetworkConfig(str(network["host"]),
                              as_int(network["planner_port"], "network.planner_port", minimum=0),
                              _advertise(network["advertise"])),
        loader=LoaderConfig(as_int(loader["read_ahead_row_groups"], "loader.read_ahead_row_groups", minimum=1),
                            as_int(loader["shadows"], "loader.shadows", minimum=0), _hosts(loader["hosts"]),
                            as_int(loader["read_ahead_bytes"], "loader.read_ahead_bytes", minimum=0),
                            as_choice(loader["partition"], "loader.partition", ("manual", "auto")),
                            _parse_budget(loader["budget"]),
                            scaling=_parse_scaling(loader["scaling"], [s.name for s in sources]),
                            sample_level_bytes=as_int(loader["sample_level_bytes"], "loader.sample_level_bytes",
                                                      minimum=0)),
        constructor=ConstructorConfig(dp_per_constructor),
        checkpoint=CheckpointConfig(as_int(checkpoint["every"], "checkpoint.every", minimum=1)),
        pad_token_id=as_int(top["pad_token_id"], "pad_token_id", minimum=0),
        run_dir=_path(base_dir, top["run_dir"], "run_dir"),
        data_root=data_root,
        strategy=_parse_strategy(top["strategy"], base_dir),
        vision=_parse_vision(top["vision"]),
        security=_parse_security(top["security"], base_dir),
        metrics=_parse_metrics(top["metrics"]),
        liveness=LivenessConfig.parsed(top["liveness"]),
        ray=_parse_ray(top["ray"], mesh.world_size),
        planner=PlannerConfig(as_int(planner["standbys"], "planner.standbys", minimum=0, maximum=1)),  # 2 would race
        deployment=top["deployment"], path=path,  # deployment checked by deployment_defaults
        plugins=plugins, **shape_keys(top, global_batch),
    )


def _advertise(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return check_host(value, "network.advertise")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _hosts(value: Any) -> int | str:
    """loader.hosts: auto, or how many loader processes (0: one per actor)."""
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError(f"loader.hosts: expected auto, 0 (one process per loader actor) or a number of "
                          f"loader processes, got {value!r}")
    return value


def _parse_metrics(raw: Any) -> MetricsConfig:
    port = check_keys(raw, "metrics", defaults_of(MetricsConfig))["port"]
    return MetricsConfig(None if port is None else as_int(port, "metrics.port", minimum=0, maximum=65535))


def _parse_scaling(raw: Any, names: list[str]) -> ScalingConfig:
    """loader.scaling: {enabled, interval, up_threshold, down_threshold, consecutive, max_actors, sources}."""
    if isinstance(raw, ScalingConfig):  # absent: the default
        return raw
    f = check_keys(raw, "loader.scaling", defaults_of(ScalingConfig))
    as_flag(f["enabled"], "loader.scaling.enabled")
    up = as_number(f["up_threshold"], "loader.scaling.up_threshold", minimum=0.0)
    down = as_number(f["down_threshold"], "loader.scaling.down_threshold", minimum=0.0)
    if up > 1:
        raise ConfigError(f"loader.scaling.up_threshold: a weight per actor, at most 1, got {up}")
    if down > up / 2:
        raise ConfigError(f"loader.scaling.down_threshold: must be <= up_threshold / 2 = {up / 2} (one more "
                          f"actor at most halves a source's load: a scale-up must not trigger a scale-down), "
                          f"got {down}")
    sources = f["sources"] or []
    if not isinstance(sources, (list, tuple)):
        raise ConfigError(f"loader.scaling.sources: expected a list of source names, got {sources!r}")
    for name in sources:
        if name not in names:
            raise ConfigError(f"loader.scaling.sources: no source named {name!r} (have: {', '.join(names)})")
    return ScalingConfig(f["enabled"], as_int(f["interval"], "loader.scaling.interval", minimum=1), up, down,
                         as_int(f["consecutive"], "loader.scaling.consecutive", minimum=1),
                         as_int(f["max_actors"], "loader.scaling.max_actors", minimum=1), tuple(sources))


def _parse_budget(raw: Any) -> PartitionBudget:
    """loader.budget: {cpus, memory_gib}, each a positive number or absent (this machine's)."""
    if isinstance(raw, PartitionBudget):  # absent: the default
        return raw
    f = check_keys(raw, "loader.budget", defaults_of(PartitionBudget))
    for key in ("cpus", "memory_gib"):
        if f[key] is not None and as_number(f[key], f"loader.budget.{key}") <= 0:
            raise ConfigError(f"loader.budget.{key}: must be > 0, got {f[key]}")
    return PartitionBudget(*(None if f[k] is None else float(f[k]) for k in ("cpus", "memory_gib")))


def _parse_ray(raw: Any, world_size: int) -> RayConfig:
    f = check_keys(raw, "ray", defaults_of(RayConfig))
    resources = check_keys(f["loader_resources"], "ray.loader_resources",
                           {k: REQUIRED for k in f["loader_resources"] or {}})
    nodes = f["trainer_nodes"] or []
    if not isinstance(nodes, list) or not all(isinstance(n, str) and n.strip() for n in nodes):
        raise ConfigError(f"ray.trainer_nodes: expected a list of node IPs or custom resource names, got {nodes!r}")
    if nodes and len(nodes) != world_size:
        raise ConfigError(f"ray.trainer_nodes: {len(nodes)} entries, but the mesh has {world_size} trainer ranks "
                          f"(one node per rank, in rank order)")
    cpus = as_number(f["cpus"], "ray.cpus", minimum=0.0)
    if cpus <= 0:
        raise ConfigError(f"ray.cpus: must be > 0 (a fraction of a CPU per actor), got {cpus}")
    per_actor = {str(k): as_number(v, f"ray.loader_resources.{k}", minimum=0.0) for k, v in resources.items()}
    return RayConfig(cpus, per_actor, tuple(nodes))


def _parse_mesh(raw: Any, context_length: int, pad_to_multiple: int | None, dp_per_constructor: int) -> Mesh:
    f = check_keys(raw, "mesh", {**MESH_KEYS, "order": ",".join(Mesh.order)})
    sizes = {k: as_int(f[k], f"mesh.{k}", minimum=1) for k in ("pp", "dp", "cp", "tp")}
    order = tuple(a.strip() for a in str(f["order"]).split(","))
    if sorted(order) != sorted(sizes):
        raise ConfigError(f"mesh.order: {f['order']!r} must list each of pp, dp, cp, tp once, fastest-varying first")
    cp_split = as_choice(f["cp_split"], "mesh.cp_split", tuple(CP_SPLITS))
    cp_format = as_choice(f["cp_format"], "mesh.cp_format", CP_FORMATS)
    chunks = 2 * sizes["cp"] if cp_format == "thd" else chunk_count(sizes["cp"], cp_split)
    split = "thd (per-sequence, 2*cp chunks)" if cp_format == "thd" else cp_split
    for length, key in ((context_length, "context_length"), (pad_to_multiple, "pad_to_multiple")):
        if sizes["cp"] > 1 and length and length % chunks:
            raise ConfigError(f"mesh.cp: global_batch.{key} {length} must divide into "
                              f"{chunks} equal chunks for the {split} split over cp={sizes['cp']}")
    return Mesh(**sizes, dp_per_constructor=dp_per_constructor, order=order, cp_split=cp_split, cp_format=cp_format)


def _parse_vision(raw: Any) -> VisionConfig:
    d = VisionConfig()
    f = check_keys(raw, "vision", {k: getattr(d, k) for k in d.__dataclass_fields__})
    ints = {k: as_int(f[k], f"vision.{k}", minimum=1 if k != "image_token_id" else 0)
            for k in ("patch_size", "merge_size", "min_pixels", "max_pixels", "image_token_id", "vision_start_id",
                      "vision_end_id")}
    if ints["max_pixels"] < ints["min_pixels"]:
        raise ConfigError(f"vision.max_pixels: {ints['max_pixels']} is below vision.min_pixels {ints['min_pixels']}")
    background = f["background"]
    if not (isinstance(background, (list, tuple)) and len(background) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in background)):
        raise ConfigError(f"vision.background: expected a list of three integers 0..255 (R, G, B), "
                          f"got {background!r}")
    return VisionConfig(**ints, decode_at=as_choice(f["decode_at"], "vision.decode_at", ("constructor", "loader")),
                        on_bad_image=as_choice(f["on_bad_image"], "vision.on_bad_image", ("skip", "fail")),
                        background=tuple(background))


def _parse_security(raw: Any, base_dir: Path) -> SecurityConfig:
    f = check_keys(raw, "security", {**defaults_of(SecurityConfig), "tls": None})
    t = check_keys(f["tls"], "security.tls", defaults_of(TLSConfig))

    def file(value: Any, where: str) -> Path | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: expected a file path, got {value!r}")
        path = (base_dir / value).resolve()
        if not path.is_file():
            raise ConfigError(f"{where}: file not found: {path}")
        return path

    for key in ("verify_client", "enabled"):
        if not (isinstance(t[key], bool) or (key == "enabled" and t[key] is None)):
            raise ConfigError(f"security.tls.{key}: expected true or false, got {t[key]!r}")
    tls = TLSConfig(file(t["cert"], "security.tls.cert"), file(t["key"], "security.tls.key"),
                    file(t["ca"], "security.tls.ca"), t["verify_client"], t["enabled"])
    if (tls.cert is None) != (tls.key is None):
        raise ConfigError("security.tls: give both cert and key (the role's certificate and its private key)")
    if tls.on and tls.cert is None:
        raise ConfigError("security.tls.enabled: TLS needs security.tls.cert and security.tls.key")
    if tls.verify_client and not tls.on:
        raise ConfigError("security.tls.verify_client: mutual TLS needs TLS on (security.tls.cert and key)")
    if tls.verify_client and tls.ca is None:
        raise ConfigError("security.tls.ca: mutual TLS (verify_client: true) needs the CA that signs client "
                          "certificates")
    return SecurityConfig(
        cluster_secret_file=file(f["cluster_secret_file"], "security.cluster_secret_file"),
        trainer_tokens_file=file(f["trainer_tokens_file"], "security.trainer_tokens_file"),
        inspect_token_file=file(f["inspect_token_file"], "security.inspect_token_file"),
        tls=tls,
        ticket_ttl_seconds=as_number(f["ticket_ttl_seconds"], "security.ticket_ttl_seconds", minimum=1),
    )


def _parse_strategy(raw: Any, base_dir: Path) -> StrategyConfig | None:
    if raw is None:
        return None
    f = check_keys({"file": raw} if isinstance(raw, str) else raw, "strategy",
                {"file": REQUIRED, "function": "build", "options": None})
    file = (base_dir / str(f["file"])).resolve()
    if not file.is_file():
        raise ConfigError(f"strategy.file: file not found: {file}")
    options = f["options"] or {}
    if not isinstance(options, dict):
        raise ConfigError("strategy.options: expected a mapping of keyword arguments")
    return StrategyConfig(file, str(f["function"]), options)


def _parse_global_batch(raw: Any) -> GlobalBatchConfig:
    f = check_keys(raw, "global_batch", {
        "context_length": REQUIRED, "microbatches": 1,
        "samples_per_step": None, "tokens_per_step": None, "pad_to_multiple": None,
    })
    if (f["samples_per_step"] is None) == (f["tokens_per_step"] is None):
        raise ConfigError("global_batch: give exactly one of 'samples_per_step' or 'tokens_per_step'")
    return GlobalBatchConfig(
        context_length=as_int(f["context_length"], "global_batch.context_length", minimum=1),
        microbatches=as_int(f["microbatches"], "global_batch.microbatches", minimum=1),
        samples_per_step=None if f["samples_per_step"] is None
        else as_int(f["samples_per_step"], "global_batch.samples_per_step", minimum=1),
        tokens_per_step=None if f["tokens_per_step"] is None
        else as_int(f["tokens_per_step"], "global_batch.tokens_per_step", minimum=1),
        pad_to_multiple=None if f["pad_to_multiple"] is None
        else as_int(f["pad_to_multiple"], "global_batch.pad_to_multiple", minimum=1),
    )


def _parse_cost(raw: Any) -> CostConfig:
    f = check_keys(raw, "cost", defaults_of(CostConfig))
    return CostConfig(
        model=as_choice(f["model"], "cost.model", tuple(COST_MODELS)),
        a=as_number(f["a"], "cost.a", minimum=0.0),
        b=as_number(f["b"], "cost.b", minimum=0.0),
        fit=as_flag(f["fit"], "cost.fit"),
        lag=as_int(f["lag"], "cost.lag", minimum=1),
        window=as_int(f["window"], "cost.window", minimum=1),
        fit_encoder=as_flag(f["fit_encoder"], "cost.fit_encoder"),
    )
