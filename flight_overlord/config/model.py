"""The run configuration's schema: one frozen dataclass per YAML section, each default written once.

The YAML shape is the Python shape: section ``loader`` is ``Config.loader`` (a ``LoaderConfig``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.mesh import Mesh
from ..core.run_shape import RunShape
from ..core.vision import VisionSpec
from ..errors import ConfigError  # noqa: F401 - re-exported: config.ConfigError is the one of errors.py
from .fields import defaults_of
from .liveness import LivenessConfig


@dataclass(frozen=True)
class TransformConfig:
    """A sample transform by registered name, with its options (e.g. a tokenizer file)."""
    name: str = "byte_tokenizer"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceConfig:
    name: str
    paths: Any  # config.sources.SourcePaths: the files, expanded from the config's paths when first asked for
    text_column: str
    transform: TransformConfig | None  # None: pre-tokenized (tokens_column)
    weight: float
    loaders: int  # source-loader actors; the row groups are split this many ways
    image_column: str | None = None  # image-text sources: list<binary> of images interleaved with text_column
    shuffle_window: int = 1  # row groups whose rows are drawn interleaved (core/order.py; docs/methods/data-order.md)
    format: str = "auto"  # parquet | arrow (IPC file or stream) | auto: each file's from its name (formats/)
    tokens_column: str | None = None  # pre-tokenized: a column of token id lists, no transform
    loss_mask_column: str | None = None  # pre-tokenized: per-token 0/1, 0 = not a training target (SFT)

    @property
    def files(self) -> tuple[str, ...]:
        """Local paths, or pyarrow.fs URIs (query string kept), sorted."""
        return self.paths.files

    @property
    def file_ids(self) -> tuple[str, ...]:
        """Stable names used in sample keys: path relative to data_root, or the URI without its query string."""
        return self.paths.file_ids


@dataclass(frozen=True)
class VisionConfig:
    """Image-text sources: the encoder's patch geometry and where images are decoded."""
    patch_size: int = VisionSpec.patch_size
    merge_size: int = VisionSpec.merge_size
    min_pixels: int = VisionSpec.min_pixels
    max_pixels: int = VisionSpec.max_pixels
    image_token_id: int = 256  # the placeholder token; 256 is just past the byte tokenizer's vocabulary
    vision_start_id: int = 257  # wraps every placeholder run (Qwen2-VL's <|vision_start|> ... <|vision_end|>),
    vision_end_id: int = 258    # so adjacent images stay distinct runs
    decode_at: str = "constructor"  # constructor: compressed bytes cross the network; loader: pixels do
    on_bad_image: str = "skip"  # skip: drop the sample, log its key and count it; fail: stop the run
    background: tuple[int, int, int] = VisionSpec.background  # RGB under transparent pixels (Qwen2-VL: white)

    @property
    def spec(self) -> VisionSpec:
        """The encoder geometry and decoding options, as the pure image logic takes them."""
        return VisionSpec(self.patch_size, self.merge_size, self.min_pixels, self.max_pixels,
                          background=self.background)


@dataclass(frozen=True)
class GlobalBatchConfig:
    context_length: int
    microbatches: int  # per data-parallel rank per step; each is one sequence packed to context_length
    samples_per_step: int | None
    tokens_per_step: int | None
    pad_to_multiple: int | None = None  # None: pad every sequence to the full microbatch capacity


@dataclass(frozen=True)
class CostConfig:
    model: str = "attention"  # a registered cost model (core/cost.py): "attention": a*l + b*l^2 ; "tokens": l
    a: float = 1.0
    b: float = 1.0 / 4096
    fit: bool = False  # fit a and b online to the trainers' reported compute seconds (a, b: the prior)
    lag: int = 4       # with fit: step s is planned with the fit of the reports of steps <= s - lag
    window: int = 64   # with fit: the fit reads the reports of this many steps (robust regression)
    fit_encoder: bool = False  # with fit and an image graph: fit its patches model to encoder_seconds too


@dataclass(frozen=True)
class BalanceConfig:
    method: str = "greedy"  # a registered balancer (core/balance), or "none"


@dataclass(frozen=True)
class NetworkConfig:
    host: str = "127.0.0.1"  # the address every role binds to (0.0.0.0: every interface; then set advertise)
    planner_port: int = 0  # 0: any free port
    advertise: str | None = None  # the host others reach a role at (registered, in tickets); None: host


@dataclass(frozen=True)
class MetricsConfig:
    port: int | None = None  # Prometheus metrics of each role at http://HOST:PORT/metrics; 0: any free port


@dataclass(frozen=True)
class RayConfig:
    """Placement under ``overlord up --backend ray`` (``deploy/ray_backend.py``)."""
    cpus: float = 0.1  # per actor: the roles are I/O and numpy bound, and many share a node
    loader_resources: dict[str, float] = field(default_factory=dict)  # every loader actor asks for these
    # (e.g. {cpu_node: 0.01}: only nodes started with that custom resource), and loaders spread over them
    trainer_nodes: tuple[str, ...] = ()  # per trainer rank: a node IP or a custom resource of its node;
    # each constructor then runs where most of the ranks it serves are (empty: anywhere)


@dataclass(frozen=True)
class PartitionBudget:
    """What ``loader.partition: auto`` may use for the loader hosts; None: this machine's CPUs, half its RAM."""
    cpus: float | None = None
    memory_gib: float | None = None


@dataclass(frozen=True)
class ScalingConfig:
    """Mixture-driven scaling of loader actors (core/scaling.py): a source whose weight per actor,
    averaged over ``interval`` steps, stays above ``up_threshold`` for ``consecutive`` intervals gets one
    more actor (up to ``max_actors``, pre-provisioned idle in its loader processes); below
    ``down_threshold`` as long, one fewer (down to its ``loaders``). The streams do not change."""
    enabled: bool = False
    interval: int = 10
    up_threshold: float = 0.5
    down_threshold: float = 0.2  # at most up_threshold / 2, so a scale-up never triggers a scale-down
    consecutive: int = 2
    max_actors: int = 2  # per source, idle ones included
    sources: tuple[str, ...] = ()  # the sources that may scale (their idle actors are provisioned); empty: all


@dataclass(frozen=True)
class LoaderConfig:
    read_ahead_row_groups: int = 2
    shadows: int = 0  # hot standbys per loader actor (per loader process, which stands by for all it hosts)
    hosts: int | str = "auto"  # loader processes hosting the actors (round robin); auto: min(ceil(actors / 4),
    # this machine's CPUs); 0: one process per actor
    # per actor: read ahead only while its buffer holds less (0: no byte bound). 4 MiB, measured
    # (docs/methods/memory-peers.md): row groups of ~0.1 MiB still read 2 ahead; of 2 MiB, 1 ahead, not 2:
    # loader hosts 876 -> 594 MiB at 96 sources with no loss of samples/s that showed
    read_ahead_bytes: int = 4 * 1024 * 1024
    partition: str = "manual"  # manual: sources' loaders and hosts as written; auto: `overlord partition`'s plan
    budget: PartitionBudget = PartitionBudget()
    # Set from run_dir/partition/plan.json under partition: auto (not a YAML key): the actors of each host.
    groups: tuple[tuple[tuple[str, int], ...], ...] = ()
    scaling: ScalingConfig = ScalingConfig()
    # a text row group whose token ids take more bytes than this is buffered as its rows' token counts
    # only; the rows a step asks for are read again from the file (0: always the whole row group)
    sample_level_bytes: int = 0


DEPLOYMENTS = ("default", "single_node")


def deployment_defaults(deployment: Any, mesh: Any) -> tuple[dict, dict]:
    """The defaults of the ``loader`` and ``constructor`` keys under ``deployment`` (``mesh``: the
    config's own mesh section, for its ``dp``; checked where the mesh is parsed). ``single_node``, for a
    run whose ranks share one machine: ``constructor.dp_per_constructor`` every data-parallel rank (one
    constructor process) and ``loader.hosts: 1`` (every loader actor in one process); keys the config
    sets win. The same plans and streams as the default deployment in fewer processes: less memory per
    node (docs/methods/memory-peers.md)."""
    if deployment not in DEPLOYMENTS:
        raise ConfigError(f"deployment: expected one of {', '.join(DEPLOYMENTS)}, got {deployment!r}")
    loader = {key: default for key, default in defaults_of(LoaderConfig).items() if key != "groups"}
    constructor = defaults_of(ConstructorConfig)
    if deployment == "single_node":
        dp = mesh.get("dp") if isinstance(mesh, dict) else None
        loader["hosts"], constructor["dp_per_constructor"] = 1, dp if isinstance(dp, int) and dp > 0 else 1
    return loader, constructor


@dataclass(frozen=True)
class ConstructorConfig:
    dp_per_constructor: int = 1


@dataclass(frozen=True)
class PlannerConfig:
    standbys: int = 0  # hot standby Planner processes (local deployment): one takes over the address on a death


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 50  # steps between Planner snapshots; loaders snapshot every this many fetches


@dataclass(frozen=True)
class TLSConfig:
    """TLS for every role (``grpc+tls://``): the role's certificate and key, the CA that signed the
    certificates, and ``verify_client`` for mutual TLS (clients then need a certificate the CA signed,
    with the client-auth usage). ``enabled``: None turns TLS on when ``cert`` is given."""
    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    verify_client: bool = False
    enabled: bool | None = None

    @property
    def on(self) -> bool:
        return self.cert is not None if self.enabled is None else self.enabled


@dataclass(frozen=True)
class SecurityConfig:
    """Who may call what (``wire/security.py``). Internal calls always need the cluster secret: from
    ``cluster_secret_file``, else ``$OVERLORD_CLUSTER_SECRET``, else made fresh by ``overlord up``.
    Trainer calls need a token only when ``trainer_tokens_file`` is set (one per line, ``TOKEN`` or
    ``TOKEN RANKS`` to bind it to ranks such as ``0-7,12``); inspection
    calls only when ``inspect_token_file`` is set."""
    cluster_secret_file: Path | None = None
    trainer_tokens_file: Path | None = None
    inspect_token_file: Path | None = None
    tls: TLSConfig = TLSConfig()
    ticket_ttl_seconds: float = 3600.0  # how long a ticket from the Planner can be redeemed


@dataclass(frozen=True)
class StrategyConfig:
    """A strategy file: ``function(strategy, **options)`` programs the Planner (planner/strategy.py)."""
    file: Path
    function: str = "build"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    seed: int
    sources: tuple[SourceConfig, ...]
    mesh: Mesh  # with constructor.dp_per_constructor
    global_batch: GlobalBatchConfig
    cost: CostConfig
    balance: BalanceConfig
    prefetch: int
    network: NetworkConfig
    loader: LoaderConfig
    constructor: ConstructorConfig
    checkpoint: CheckpointConfig
    pad_token_id: int
    run_dir: Path
    data_root: Path
    strategy: StrategyConfig | None = None
    vision: VisionConfig = VisionConfig()
    security: SecurityConfig = SecurityConfig()
    metrics: MetricsConfig = MetricsConfig()
    ray: RayConfig = RayConfig()
    planner: PlannerConfig = PlannerConfig()
    liveness: LivenessConfig = LivenessConfig()
    schedule: RunShape = RunShape()  # the global batch and context stages per step (core/run_shape.py)
    skip: tuple[tuple[int, int], ...] = ()  # [first, last] steps whose samples are dropped (core/skips.py)
    deployment: str = "default"  # one of DEPLOYMENTS (single_node: every role in one process, topology.roles)
    path: Path | None = None  # the YAML file this came from, so child processes can reload it
    plugins: tuple[str, ...] = ()  # user code imported when the config was read (config/plugins.py)

    @property
    def num_constructors(self) -> int:
        return self.mesh.num_constructors

    def provisioned_actors(self, source: SourceConfig) -> int:
        """Loader actors of ``source`` in all: its ``loaders``, plus idle ones that scaling may activate."""
        scaling = self.loader.scaling
        scales = scaling.enabled and (not scaling.sources or source.name in scaling.sources)
        return max(source.loaders, scaling.max_actors) if scales else source.loaders

    def source(self, name: str) -> SourceConfig:
        for src in self.sources:
            if src.name == name:
                return src
        raise ConfigError(f"no source named {name!r} (have: {', '.join(s.name for s in self.sources)})")
