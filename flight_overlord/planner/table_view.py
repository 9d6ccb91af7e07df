"""``constructor_view`` from a plan's columns (``PickTable``), without a ``Pick`` per sample: the
fast path at thousands of ranks, taken when every sample sits in one bin and once in the step.

Every constructor's view of a step is made in one pass (``table_views``): a few numpy calls for the
whole step rather than per constructor, which is what a view cost when the samples per constructor
are few (the Planner's CPU per step at dp 64 was mostly fixed per-call costs)."""
from __future__ import annotations

import numpy as np

from ..core.mesh import Mesh
from ..wire import encode
from ..wire.plan import ConstructorPlan, PlanView, view_header, view_rows
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
    """One constructor's view (``table_views`` of the step, that constructor's)."""
    return table_views(plan, mesh, registry, broadcast, [constructor])[0].plan()


def table_views(plan: StepPlan, mesh: Mesh, registry: Registry, broadcast: frozenset[str],
                constructors: list[int] | None = None) -> list[PlanView]:
    """``constructor_view`` of each of ``constructors`` (default: all) from the plan's columns, as the
    plans stream carries it, without a Pick per sample: every sample sits in one bin (no image graph,
    no HDP) and once in the step, so one constructor alone fetches it. A view numbers its samples in
    the order of its buckets' microbatches; its fetch groups are the loader actors in order of their
    first sample. The samples' columns are made for the whole step at once, then sliced per view."""
    t, m = plan.table, plan.microbatches
    constructors = list(range(mesh.num_constructors)) if constructors is None else constructors
    buckets = [mesh.buckets_of_constructor(c, plan.axis) for c in constructors]
    bins = [plan.bin_indices[b * m + i] for own in buckets for b in own for i in range(m)]
    sizes = np.array([len(x) for x in bins], dtype=np.int64)
    rows = np.concatenate(bins) if bins else np.zeros(0, dtype=np.int64)
    bins_per_view = [len(own) * m for own in buckets]
    per_view = np.bincount(np.repeat(np.arange(len(buckets)), bins_per_view), weights=sizes,
                           minlength=len(buckets)).astype(np.int64)
    view_of = np.repeat(np.arange(len(buckets)), per_view)
    starts = np.concatenate([[0], np.cumsum(per_view)]).tolist()
    actor_of, actors = _actors(t, rows, registry)
    # A view's fetch groups: its (view, actor) pairs in order of their first sample. The views' rows are
    # consecutive, so the pairs in order of first appearance are by view, then by first sample.
    _, first, which = np.unique(view_of * max(len(actors), 1) + actor_of, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")
    number = np.empty_like(by_first)
    number[by_first] = np.arange(by_first.size)
    groups_before = np.concatenate([[0], np.cumsum(np.bincount(view_of[first], minlength=len(buckets)))])
    group = number[which.reshape(-1)] - groups_before[view_of]
    fetch: list[list] = [[] for _ in buckets]
    located = [[*actor, registry.locations(actor)] for actor in actors]
    for view, actor in zip(view_of[first[by_first]].tolist(), actor_of[first[by_first]].tolist()):
        fetch[view].append(located[actor])
    all_keys = t.keys()
    step_rows = view_rows([[all_keys[i] for i in rows.tolist()], t.tokens[rows], group, t.epoch[rows],
                           np.array(t.files + [""], dtype=object)[t.file[rows]], t.row_group[rows], t.row[rows],
                           np.ones(rows.size, dtype=np.int32)])
    views, sizes = [], sizes.tolist()
    first_bins = np.cumsum([0, *bins_per_view]).tolist()
    dimensions = sorted(broadcast)
    for j, own in enumerate(buckets):
        first_bin = first_bins[j]
        bin_sizes = [[bucket, sizes[first_bin + i * m:first_bin + (i + 1) * m]] for i, bucket in enumerate(own)]
        header = view_header(plan.step, plan.axis, dimensions, plan.capacity, fetch[j], plan.encoder_axis, {}, bin_sizes)
        views.append(PlanView(encode(header), step_rows.slice(starts[j], starts[j + 1] - starts[j])))
    return views


def _actors(t, rows: np.ndarray, registry: Registry) -> tuple[np.ndarray, list[tuple[str, int]]]:
    """Per row, the index of its owning loader actor in the returned list; the registry is asked once
    per distinct (source, file, row group, epoch)."""
    if not rows.size:
        return rows, []
    source, file, group, epoch = t.source[rows], t.file[rows], t.row_group[rows], t.epoch[rows]
    # one int64 per row group: file codes, row groups and epochs are small non-negative ints
    code = ((source * (int(file.max()) + 1) + file) * (int(group.max()) + 1) + group) * (int(epoch.max()) + 1) + epoch
    distinct, first, which = np.unique(code, return_index=True, return_inverse=True)
    owners = [registry.owner(t.sources[s], t.files[f], g, e) for s, f, g, e in
              zip(source[first].tolist(), file[first].tolist(), group[first].tolist(), epoch[first].tolist())]
    actors = list(dict.fromkeys(owners))
    index = {a: i for i, a in enumerate(actors)}
    return np.array([index[o] for o in owners], dtype=np.int64)[which.reshape(-1)], actors
