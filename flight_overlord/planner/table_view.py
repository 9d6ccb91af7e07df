"""``constructor_view`` from a plan's columns (``PickTable``), without a ``Pick`` per sample: the
fast path at thousands of ranks, taken when every sample sits in one bin and once in the step."""
from __future__ import annotations

import numpy as np

from ..core.mesh import Mesh
from ..wire.plan import ConstructorPlan, FetchGroup
from .registry import Registry
from .step_plan import StepPlan


def keys_unique(plan: StepPlan) -> bool:
    """No sample key twice in the step (a small source can wrap into its next epoch within a step:
    the same row twice, which the view by Picks numbers once)."""
    if plan.keys_unique is None:
        plan.keys_unique = len(set(plan.table.keys())) == len(plan.table)
    return plan.keys_unique


def table_view(plan: StepPlan, constructor: int, mesh: Mesh, registry: Registry,
                broadcast: frozenset[str]) -> ConstructorPlan:
    """``constructor_view`` from the plan's columns, without a Pick per sample: every sample sits in
    one bin (no image graph, no HDP) and once in the step, so this constructor alone fetches it."""
    t, m = plan.table, plan.microbatches
    buckets = mesh.buckets_of_constructor(constructor, plan.axis)
    bins = [plan.bin_indices[b * m + i] for b in buckets for i in range(m)]
    rows = np.concatenate(bins) if bins else np.zeros(0, dtype=np.int64)
    ends = np.cumsum([len(x) for x in bins]).tolist()
    positions = list(range(rows.size))
    flat = [positions[a:b] for a, b in zip([0] + ends[:-1], ends)]
    keys = t.keys()
    epoch, file, group, row = (t.epoch[rows], t.file[rows], t.row_group[rows], t.row[rows])
    # the owning loader actor, asked once per distinct (source, file, row group, epoch)
    distinct, which = np.unique(np.stack([t.source[rows], file, group, epoch], axis=1), axis=0, return_inverse=True)
    owners = [registry.owner(t.sources[s], t.files[f], g, e) for s, f, g, e in distinct.tolist()]
    actors = list(dict.fromkeys(owners))
    actor_of = np.array([actors.index(o) for o in owners], dtype=np.int64)[which.reshape(-1)] if rows.size else rows
    present, first = np.unique(actor_of, return_index=True)
    fetch = []
    files = np.array(t.files + [""], dtype=object)[file].tolist()
    samples = [[e, f, g, r, 1] for e, f, g, r in zip(epoch.tolist(), files, group.tolist(), row.tolist())]
    for a in present[np.argsort(first)].tolist():  # loaders in order of their first sample
        items = np.flatnonzero(actor_of == a).tolist()
        fetch.append(FetchGroup(*actors[a], registry.locations(actors[a]), items, [samples[i] for i in items]))
    return ConstructorPlan(plan.step, plan.axis, sorted(broadcast), plan.capacity, [keys[i] for i in rows.tolist()],
                           t.tokens[rows].tolist(), {b: flat[j * m:(j + 1) * m] for j, b in enumerate(buckets)},
                           fetch, plan.encoder_axis, None, {})
