"""What each Data Constructor gets of a planned step: its view (``ConstructorPlan``; on the plans stream a
``PlanView``), made from the plan's columns for every constructor in one pass where it can
(``table_view.py``), else from its Picks."""
from __future__ import annotations

from ..core.mesh import Mesh
from ..wire.plan import ConstructorPlan, FetchGroup, PlanView
from .hdp import hdp_groups
from .registry import Registry
from .step_plan import StepPlan
from .table_view import keys_unique, table_view, table_views


def step_views(plan: StepPlan, mesh: Mesh, registry: Registry, broadcast: frozenset[str]) -> list[PlanView]:
    """Every constructor's view, in order, as the plans stream carries it (from the columns in one pass
    when it can)."""
    if _by_columns(plan):
        return table_views(plan, mesh, registry, broadcast)
    return [PlanView.of(constructor_view(plan, c, mesh, registry, broadcast)) for c in range(mesh.num_constructors)]


def wire_view(plan: StepPlan, constructor: int, mesh: Mesh, registry: Registry, broadcast: frozenset[str]) -> PlanView:
    """One constructor's view as the plans stream carries it."""
    if _by_columns(plan):
        return table_views(plan, mesh, registry, broadcast, [constructor])[0]
    return PlanView.of(constructor_view(plan, constructor, mesh, registry, broadcast))


def _by_columns(plan: StepPlan) -> bool:
    return plan.table is not None and plan.encoder is None and plan.axis != "HDP" and keys_unique(plan)


def constructor_view(plan: StepPlan, constructor: int, mesh: Mesh, registry: Registry,
                     broadcast: frozenset[str]) -> ConstructorPlan:
    """What one constructor assembles: its buckets' microbatches (and, with an image graph, the
    samples its ranks encode) as indices into ``keys``, the planned length of each sample, and
    where to fetch each one, with how many constructors fetch it in all."""
    if _by_columns(plan):
        return table_view(plan, constructor, mesh, registry, broadcast)
    consumers = _consumers(plan, mesh)
    index: dict[str, int] = {}
    keys, lengths, fetch = [], [], {}

    def item(pick) -> int:
        ref = pick.ref
        if ref.key not in index:
            index[ref.key] = len(keys)
            actor = registry.owner(ref.source, ref.file, ref.row_group, ref.epoch)
            group = fetch.setdefault(actor, FetchGroup(*actor, registry.locations(actor), [], []))
            group.items.append(len(keys))
            group.samples.append([ref.epoch, ref.file, ref.row_group, ref.row, consumers[ref.key]])
            keys.append(ref.key)
            lengths.append(pick.tokens)
        return index[ref.key]

    microbatches = {b: [[item(p) for p in bin_] for bin_ in plan.bucket_bins(b)]
                    for b in mesh.buckets_of_constructor(constructor, plan.axis)}
    encoder = None
    if plan.encoder is not None:  # [item, image index, owner bucket, owner microbatch] per image a rank encodes
        owner = {p.ref.key: divmod(i, plan.microbatches) for i, bin_ in enumerate(plan.bins) for p in bin_}
        encoder = {b: [[item(p), image, *owner[p.ref.key]] for p, image in plan.encoder[b]]
                   for b in mesh.buckets_of_constructor(constructor, plan.encoder_axis)}
    extra = {"hdp": hdp_groups(plan, microbatches)} if plan.axis == "HDP" else {}
    return ConstructorPlan(plan.step, plan.axis, sorted(broadcast), plan.capacity, keys, lengths, microbatches,
                           list(fetch.values()), plan.encoder_axis, encoder, extra)


def _consumers(plan: StepPlan, mesh: Mesh) -> dict[str, int]:
    """Per sample, how many constructors fetch it: 2 when an image graph sends its images to a
    rank of another constructor than its sequence's. The loader keeps it until both have."""
    if plan.consumers is None:
        needs: dict[str, set[int]] = {}
        for bucket in range(plan.num_buckets):
            c = mesh.constructor_of(mesh.dp_of_bucket(bucket, plan.axis))
            for bin_ in plan.bucket_bins(bucket):
                for pick in bin_:
                    needs.setdefault(pick.ref.key, set()).add(c)
        for bucket, picks in enumerate(plan.encoder or []):
            c = mesh.constructor_of(mesh.dp_of_bucket(bucket, plan.encoder_axis))
            for pick, _ in picks:
                needs.setdefault(pick.ref.key, set()).add(c)
        plan.consumers = {k: len(v) for k, v in needs.items()}
    return plan.consumers
