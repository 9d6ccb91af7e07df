"""What each Data Constructor gets of a planned step: its constructor plan (``ConstructorPlan``; on the plans
stream an ``EncodedPlan``), made from the step plan's columns for every constructor in one pass.

A constructor plan numbers its samples in the order it meets them: its buckets' microbatches in order,
then (image graph) the images its ranks encode. A sample met twice is numbered once, where it is first
met: HDP lists a sample in the bin of every rank of its group, and a small source can wrap into its next
epoch within a step (the same row twice). A constructor plan's fetch groups are the loader actors in
order of their first sample; a sample's ``consumers`` counts the constructors that fetch it in the whole
step (its loader keeps it until every one has).

The samples' columns are made for the whole step with a few numpy calls, then sliced per constructor
plan: at thousands of ranks a plan's fixed costs, paid per constructor, would be most of the Planner's
CPU per step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core import hdp
from ..core.mesh import Mesh
from ..wire import encode
from ..wire.plan import EncodedPlan, plan_header_fields, plan_rows
from .picks import PickTable
from .roster import Roster
from .step_plan import StepPlan


@dataclass
class StepSamples:
    """A step's samples as rows of one table: ``bins[k]``, the rows of bin k in order; ``encoder[b]``, the
    (rows, image indices) encoder bucket b encodes (None without an image graph); ``key``, per row an id
    equal for equal sample keys."""
    table: PickTable
    bins: list[np.ndarray]
    encoder: list[tuple[np.ndarray, list[int]]] | None
    key: np.ndarray

    @classmethod
    def of(cls, plan: StepPlan) -> "StepSamples":
        if plan.table is not None and plan.encoder is None:
            return cls(plan.table, plan.bin_indices, None, _key_ids(plan.table))
        # a journaled step (Picks), or an image graph's encoder rows (Picks): one table of them all
        encoded = [p for bucket in plan.encoder or [] for p, _ in bucket]
        picks = [p for bin_ in plan.bins for p in bin_] + encoded
        table = PickTable.from_picks(list(dict.fromkeys(p.ref.source for p in picks)), picks)
        bins = _runs(0, [len(b) for b in plan.bins])
        encoder = None
        if plan.encoder is not None:
            rows = _runs(len(picks) - len(encoded), [len(b) for b in plan.encoder])
            encoder = [(r, [image for _, image in bucket]) for r, bucket in zip(rows, plan.encoder)]
        return cls(table, bins, encoder, _key_ids(table))


def constructor_plans(plan: StepPlan, mesh: Mesh, roster: Roster, broadcast: frozenset[str],
                      constructors: list[int] | None = None) -> list[EncodedPlan]:
    """The constructor plans of ``constructors`` (default: every constructor, in order), as the plans stream
    carries them."""
    samples = StepSamples.of(plan)
    constructors = list(range(mesh.num_constructors)) if constructors is None else list(constructors)
    buckets = [mesh.buckets_of_constructor(c, plan.axis) for c in constructors]
    encoder_buckets = ([mesh.buckets_of_constructor(c, plan.encoder_axis) for c in constructors]
                       if samples.encoder is not None else [() for _ in constructors])
    met = _Meetings.of(samples, buckets, encoder_buckets, plan.microbatches)
    numbering = _Numbering(met.which_plan, samples.key[met.rows], len(constructors))
    items_per_plan = np.bincount(met.which_plan[numbering.first], minlength=len(constructors))
    rows, fetch = _rows_and_fetch(samples, met.rows[numbering.first], items_per_plan, roster,
                                  _consumers(samples, plan, mesh))
    starts = np.concatenate([[0], np.cumsum(items_per_plan)]).tolist()
    headers, in_order = _Headers(plan, samples, broadcast), numbering.in_order(met)
    return [EncodedPlan(encode(headers.of(own, encoder_buckets[j], met.of_plan(j, numbering.item), fetch[j],
                                          in_order[j])),
                        rows.slice(starts[j], starts[j + 1] - starts[j])) for j, own in enumerate(buckets)]


@dataclass
class _Meetings:
    """The rows every constructor plan meets, plan after plan: its bins' rows in order, then its encoder
    rows. ``rows`` and ``which_plan`` (an index into the plans) per meeting; per plan, where its meetings
    start, how many are in its bins, and the sizes of its bins and of its encoder buckets."""
    rows: np.ndarray
    which_plan: np.ndarray
    starts: list[int]
    in_bins: list[int]
    bin_sizes: list[list[int]]
    encoded_sizes: list[list[int]]

    @classmethod
    def of(cls, samples: StepSamples, buckets: list[tuple[int, ...]], encoder_buckets: list[tuple[int, ...]],
           microbatches: int) -> "_Meetings":
        num_plans = len(buckets)
        bins = [[samples.bins[b * microbatches + i] for b in own for i in range(microbatches)] for own in buckets]
        encoded = [[samples.encoder[b][0] for b in own] for own in encoder_buckets]
        bin_sizes = [[len(x) for x in own_bins] for own_bins in bins]
        encoded_sizes = [[len(x) for x in own_rows] for own_rows in encoded]
        in_bins, in_encoder = [sum(n) for n in bin_sizes], [sum(n) for n in encoded_sizes]
        parts = [rows for j in range(num_plans) for rows in (*bins[j], *encoded[j])]
        met = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        per_plan = np.add(in_bins, in_encoder, dtype=np.int64)
        return cls(met, np.repeat(np.arange(num_plans), per_plan),
                   np.concatenate([[0], np.cumsum(per_plan)]).tolist(), in_bins, bin_sizes, encoded_sizes)

    def of_plan(self, j: int, item: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int], list[int]]:
        """Plan ``j``'s items met in its bins, its items and rows met in its encoder rows, and its sizes."""
        first, bins_end, end = self.starts[j], self.starts[j] + self.in_bins[j], self.starts[j + 1]
        return item[first:bins_end], item[bins_end:end], self.rows[bins_end:end], self.bin_sizes[j], \
            self.encoded_sizes[j]


class _Headers:
    """A constructor plan's header (``plan_header_fields``): what is the same for every plan of the step
    is made once."""

    def __init__(self, plan: StepPlan, samples: StepSamples, broadcast: frozenset[str]):
        self.plan, self.samples = plan, samples
        self.dimensions = sorted(broadcast)
        self.groups = _hdp_groups(samples, plan) if plan.axis == "HDP" else None
        self.owners = _owners(samples) if samples.encoder is not None else None

    def of(self, buckets: tuple[int, ...], encoder_buckets: tuple[int, ...], met, fetch: list,
           consecutive: bool) -> dict:
        """``consecutive``: the constructor plan's bins number their samples 0, 1, 2, ... (its microbatches go
        as sizes)."""
        plan, m = self.plan, self.plan.microbatches
        in_bins, in_encoder, encoder_rows, bin_sizes, encoded_sizes = met
        encoder = None
        if self.owners is not None:
            encoder = _encoder_rows(self.samples, encoder_buckets, in_encoder, encoder_rows, encoded_sizes,
                                    self.owners, m)
        extra = {}
        if self.groups is not None:
            extra = {"hdp": {str(b): [[list(g) for g in self.groups[b * m + i]] for i in range(m)] for b in buckets}}
        sizes = [[bucket, bin_sizes[i * m:(i + 1) * m]] for i, bucket in enumerate(buckets)]
        header = plan_header_fields(plan.step, plan.axis, self.dimensions, plan.capacity, fetch, plan.encoder_axis,
                                    extra, sizes if consecutive else None, encoder)
        if not consecutive:
            header["microbatches"] = _microbatch_lists(buckets, in_bins.tolist(), bin_sizes, m)
        return header


class _Numbering:
    """Per constructor plan, its samples numbered where first met: ``first``, the positions (into the
    meetings) of each plan's first meetings, in order; ``item``, per meeting, its sample's number within
    its plan."""

    def __init__(self, which_plan: np.ndarray, key: np.ndarray, num_plans: int):
        starts = np.concatenate([[0], np.cumsum(np.bincount(which_plan, minlength=num_plans))])
        self._which_plan, self._num_plans = which_plan, num_plans
        self._position = np.arange(which_plan.size) - starts[which_plan]
        self.once = not key.size or np.bincount(key).max() <= 1
        if self.once:  # every sample met once in the step: numbered in the order met
            self.first, self.item = np.arange(which_plan.size), self._position
            return
        _, first, which = np.unique(which_plan * (int(key.max()) + 1) + key, return_index=True, return_inverse=True)
        self.first = np.sort(first)
        number = np.empty(first.size, dtype=np.int64)
        number[np.argsort(first, kind="stable")] = np.arange(first.size)
        items_before = np.concatenate([[0], np.cumsum(np.bincount(which_plan[self.first], minlength=num_plans))])
        self.item = number[which.reshape(-1)] - items_before[which_plan]

    def in_order(self, met: "_Meetings") -> list[bool]:
        """Per constructor plan, whether the samples met in its bins are numbered 0, 1, 2, ... in the order met."""
        if self.once:
            return [True] * self._num_plans
        in_bins = self._position < np.asarray(met.in_bins, dtype=np.int64)[self._which_plan]
        misplaced = in_bins & (self.item != self._position)
        return (np.bincount(self._which_plan[misplaced], minlength=self._num_plans) == 0).tolist()


def _rows_and_fetch(samples: StepSamples, item_rows: np.ndarray, items_per_plan: np.ndarray, roster: Roster,
                    consumers: np.ndarray):
    """The ``EncodedPlan`` rows of every constructor plan's items, back to back, and each plan's fetch
    groups: ``[source, actor, locations]`` in order of their first item."""
    t, num_plans = samples.table, items_per_plan.size
    plan_of = np.repeat(np.arange(num_plans), items_per_plan)
    actor_of, actors = _actors(t, item_rows, roster)
    # the (plan, actor) pairs in order of first appearance: the plans' items are consecutive, so by plan,
    # then by first item
    _, first, which = np.unique(plan_of * max(len(actors), 1) + actor_of, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")
    number = np.empty_like(by_first)
    number[by_first] = np.arange(by_first.size)
    groups_before = np.concatenate([[0], np.cumsum(np.bincount(plan_of[first], minlength=num_plans))])
    group = number[which.reshape(-1)] - groups_before[plan_of]
    fetch: list[list] = [[] for _ in range(num_plans)]
    located = [[*actor, roster.locations(actor)] for actor in actors]
    for j, actor in zip(plan_of[first[by_first]].tolist(), actor_of[first[by_first]].tolist()):
        fetch[j].append(located[actor])
    all_keys = t.keys()
    rows = plan_rows([[all_keys[i] for i in item_rows.tolist()], t.tokens[item_rows], group, t.epoch[item_rows],
                      np.array(t.files + [""], dtype=object)[t.file[item_rows]], t.row_group[item_rows],
                      t.row[item_rows], consumers[samples.key[item_rows]]])
    return rows, fetch


def _consumers(samples: StepSamples, plan: StepPlan, mesh: Mesh) -> np.ndarray:
    """Per key id, how many constructors fetch that sample in the whole step: 2 when an image graph sends
    its images to a rank of another constructor than its sequence's, or HDP places it on a group of ranks
    of several constructors."""
    size = int(samples.key.max()) + 1 if samples.key.size else 0
    encoded = [rows for rows, _ in samples.encoder or []]
    parts = [(samples.bins, plan.axis, plan.microbatches), (encoded, plan.encoder_axis, 1)]
    rows = [r for part, _, _ in parts for r in part]
    keys = samples.key[np.concatenate(rows)] if rows else np.zeros(0, dtype=np.int64)
    if not keys.size or np.bincount(keys).max() <= 1:
        return np.ones(size, dtype=np.int32)
    def constructors(part: list[np.ndarray], axis: str, per_bucket: int) -> np.ndarray:
        owner = [mesh.constructor_of(mesh.dp_of_bucket(b, axis)) for b in range(len(part) // per_bucket)]
        return np.repeat(np.repeat(np.array(owner, dtype=np.int64), per_bucket), [len(r) for r in part])
    constructor = np.concatenate([constructors(*part) for part in parts])
    pairs = np.unique(keys * mesh.num_constructors + constructor)
    return np.bincount(pairs // mesh.num_constructors, minlength=size).astype(np.int32)


def _owners(samples: StepSamples) -> np.ndarray:
    """Per key id, the last bin that holds the sample (-1: none): where an encoded image's sequence is."""
    owner = np.full(int(samples.key.max()) + 1 if samples.key.size else 0, -1, dtype=np.int64)
    for k, rows in enumerate(samples.bins):
        owner[samples.key[rows]] = k  # bins in order: the last holding a sample stays
    return owner


def _encoder_rows(samples: StepSamples, buckets: tuple[int, ...], items: np.ndarray, met: np.ndarray,
                  sizes: list[int], owners: np.ndarray, microbatches: int) -> dict[str, list[list[int]]]:
    """A constructor plan's encoder rows: per encoder bucket, ``[item, image, owner bucket, owner
    microbatch]`` per image."""
    owner = owners[samples.key[met]]
    if (owner < 0).any():
        raise ValueError("an encoded image's sample is in no bin of its step")
    bucket_of, mb_of = np.divmod(owner, microbatches)
    rows = [list(r) for r in zip(items.tolist(), [i for b in buckets for i in samples.encoder[b][1]],
                                 bucket_of.tolist(), mb_of.tolist())]
    starts = np.cumsum([0, *sizes]).tolist()
    return {str(b): rows[starts[i]:starts[i + 1]] for i, b in enumerate(buckets)}


def _microbatch_lists(buckets: tuple[int, ...], items: list[int], sizes: list[int],
                      microbatches: int) -> dict[str, list[list[int]]]:
    """A constructor plan's microbatches as item lists, per bucket (when its items are not numbered in bin
    order)."""
    starts = np.cumsum([0, *sizes]).tolist()
    return {str(b): [items[starts[i * microbatches + k]:starts[i * microbatches + k + 1]] for k in range(microbatches)]
            for i, b in enumerate(buckets)}


def _hdp_groups(samples: StepSamples, plan: StepPlan) -> list[list[tuple[int, int]]]:
    """Per bin, per sample, ``[group size, first rank]`` (``core.hdp.bin_groups``), for the whole step."""
    return hdp.bin_groups([samples.key[rows].tolist() for rows in samples.bins], plan.num_buckets, plan.microbatches)


def _runs(start: int, lengths: list[int]) -> list[np.ndarray]:
    """Consecutive index arrays of ``lengths``, from ``start``."""
    ends = np.cumsum([start, *lengths]).tolist()
    return [np.arange(a, b, dtype=np.int64) for a, b in zip(ends[:-1], ends[1:])]


def _key_ids(t: PickTable) -> np.ndarray:
    """Per row, an id that is equal for equal sample keys (source, file name, row group, row)."""
    if not len(t):
        return np.zeros(0, dtype=np.int64)
    names = {name: i for i, name in enumerate(dict.fromkeys(t.files))}
    file = np.array([names[f] for f in t.files], dtype=np.int64)[t.file] if t.files else t.file
    columns = [t.source, file, t.row_group, t.row]
    spans = [int(c.max()) + 1 for c in columns]
    if float(np.prod(spans, dtype=np.float64)) < 2.0 ** 62:  # one int64 per row
        code = ((columns[0] * spans[1] + columns[1]) * spans[2] + columns[2]) * spans[3] + columns[3]
        ordered = np.sort(code)
        if not (ordered[1:] == ordered[:-1]).any():  # every key once, the usual step: its row is its id
            return np.arange(code.size)
        return np.unique(code, return_inverse=True)[1].reshape(-1)
    return np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)[1].reshape(-1)


def _actors(t: PickTable, rows: np.ndarray, roster: Roster) -> tuple[np.ndarray, list[tuple[str, int]]]:
    """Per row, the index of its owning loader actor in the returned list; the roster is asked once
    per distinct (source, file, row group, epoch)."""
    if not rows.size:
        return rows, []
    source, file, group, epoch = t.source[rows], t.file[rows], t.row_group[rows], t.epoch[rows]
    # one int64 per row group: file codes, row groups and epochs are small non-negative ints
    code = ((source * (int(file.max()) + 1) + file) * (int(group.max()) + 1) + group) * (int(epoch.max()) + 1) + epoch
    distinct, first, which = np.unique(code, return_index=True, return_inverse=True)
    owners = [roster.owner(t.sources[s], t.files[f], g, e) for s, f, g, e in
              zip(source[first].tolist(), file[first].tolist(), group[first].tolist(), epoch[first].tolist())]
    actors = list(dict.fromkeys(owners))
    index = {a: i for i, a in enumerate(actors)}
    return np.array([index[o] for o in owners], dtype=np.int64)[which.reshape(-1)], actors
