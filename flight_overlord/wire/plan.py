"""The plan a Data Constructor receives for one step, its constructor plan, to and from the wire.

Samples are numbered by their position in ``keys``; microbatches and encoder rows refer to them by
that index. ``fetch`` says where each sample lives: the locations of its loader actor (the active
one first, then its shadows, any of which can serve it) and, per sample, ``[epoch, file,
row_group, row, consumers]`` (``consumers``: how many constructors fetch it in all).

On the plans stream a constructor plan travels as an ``EncodedPlan``: its samples as one Arrow record batch (schema
``encoded_plan``) and the rest as a small JSON header, its app_metadata. The Planner makes the columns of
a step's constructor plans from the step plan's own arrays, with no Python object per sample and no JSON per sample.
The ``plan`` action answers the same constructor plan as one JSON object (``ConstructorPlan.to_wire``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from . import decode, encode
from .schemas import ENCODED_PLAN, load_schema


@dataclass
class FetchGroup:
    source: str                   # the owning loader actor (a process may host several)
    actor: int
    locations: list[str]          # where it is served: the active process first, then shadows
    items: list[int]              # indices into ConstructorPlan.keys
    samples: list[list]           # [epoch, file, row_group, row, consumers] per item


@dataclass
class ConstructorPlan:
    step: int
    axis: str                     # the distribution axis: what a bucket is
    broadcast: list[str]          # dimensions only rank 0 of which gets tokens
    capacity: int                 # tokens per packed microbatch
    keys: list[str]
    lengths: list[int]            # planned length of each sample (the plan may truncate one to the capacity)
    microbatches: dict[int, list[list[int]]]  # bucket -> microbatches -> sample indices, in order
    fetch: list[FetchGroup]
    encoder_axis: str | None = None
    encoder: dict[int, list[list[int]]] | None = None  # bucket -> [sample index, image, owner bucket, owner mb]
    extra: dict = field(default_factory=dict)  # "hdp": bucket -> microbatches -> [group size, first rank] per sample

    def to_wire(self) -> dict:
        # Field by field, without asdict's deep copy of every nested list (the wire encoding copies
        # anyway) nor dataclasses.fields() per object: on the Planner's hot path, once per step and constructor.
        out = dict(vars(self))
        out["fetch"] = [dict(vars(g)) for g in self.fetch]
        out["microbatches"] = {str(b): v for b, v in self.microbatches.items()}
        if self.encoder is not None:
            out["encoder"] = {str(b): v for b, v in self.encoder.items()}
        return out

    @classmethod
    def from_wire(cls, raw: dict) -> "ConstructorPlan":
        raw = dict(raw)
        raw["microbatches"] = {int(b): v for b, v in raw["microbatches"].items()}
        if raw.get("encoder") is not None:
            raw["encoder"] = {int(b): v for b, v in raw["encoder"].items()}
        raw["fetch"] = [FetchGroup(**g) for g in raw["fetch"]]
        return cls(**raw)


@dataclass
class EncodedPlan:
    """A ``ConstructorPlan`` on the plans stream: ``rows``, an ``encoded_plan`` batch with a row per sample
    (in ``keys`` order; a fetch group's items are its rows in order), and ``header``, the encoded JSON
    object of the other fields (``fetch``: ``[source, actor, locations]`` per group)."""
    header: bytes
    rows: pa.RecordBatch

    @classmethod
    def of(cls, plan: ConstructorPlan) -> "EncodedPlan":
        group = np.full(len(plan.keys), -1, dtype=np.int32)
        samples: list[list] = [[]] * len(plan.keys)
        for g, fetch in enumerate(plan.fetch):
            group[fetch.items] = g
            for item, sample in zip(fetch.items, fetch.samples):
                samples[item] = sample
        if (group < 0).any() or sum(len(f.items) for f in plan.fetch) != len(plan.keys):
            raise ValueError(f"the constructor plan of step {plan.step} does not fetch every sample exactly once")
        epoch, file, row_group, row, consumers = (list(c) for c in zip(*samples)) if samples else ([],) * 5
        return cls.from_columns(plan_header(plan), [plan.keys, plan.lengths, group, epoch, file, row_group, row,
                                                    consumers])

    @classmethod
    def from_columns(cls, header: dict, columns: list) -> "EncodedPlan":
        """``header`` (``plan_header``) and the ``encoded_plan`` columns, in schema order."""
        return cls(encode(header), plan_rows(columns))

    def plan(self) -> ConstructorPlan:
        return _plan_of(decode(self.header, "the header of a constructor plan"), self.rows)

    def to_wire(self) -> dict:
        """The ``plan`` action's answer: the same constructor plan as one JSON object."""
        return self.plan().to_wire()


def _plan_of(header: dict, rows: pa.RecordBatch) -> ConstructorPlan:
    """The ``ConstructorPlan`` an encoded plan's decoded header and rows make."""
    if rows.schema != encoded_plan_schema():
        raise ValueError(f"a constructor plan's rows must have the schema {ENCODED_PLAN!r}, got {rows.schema}")
    keys, lengths, group, epoch, file, row_group, row, consumers = (c.to_pylist() for c in rows.columns)
    group = np.asarray(group, dtype=np.int64)
    # each group's rows, in order: one stable sort, not a scan of every row per group
    order = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[order], np.arange(len(header["fetch"]) + 1)).tolist()
    if group.size and (group.min() < 0 or bounds[-1] != group.size):
        raise ValueError(f"a constructor plan's rows name fetch groups outside 0..{len(header['fetch']) - 1}")
    fetch = []
    for g, (source, actor, locations) in enumerate(header["fetch"]):
        items = order[bounds[g]:bounds[g + 1]].tolist()
        fetch.append(FetchGroup(source, actor, locations, items,
                                [[epoch[i], file[i], row_group[i], row[i], consumers[i]] for i in items]))
    encoder = header["encoder"]
    return ConstructorPlan(header["step"], header["axis"], header["broadcast"], header["capacity"], keys,
                           lengths, _microbatches(header, len(keys)), fetch,
                           header["encoder_axis"], None if encoder is None else {int(b): v for b, v in encoder.items()},
                           header["extra"])


def answer_message(plans: list[EncodedPlan]) -> tuple[bytes, pa.RecordBatch]:
    """Constructor plans of consecutive steps as one plans-stream answer: their rows back to back in one
    batch, and the header ``{"views": [each plan's header], "rows": [each plan's row count]}`` (``views``,
    the wire's name for them, is what Planners and constructors of other builds read too; the plans'
    headers are encoded JSON objects already: joined as bytes, not decoded and encoded again)."""
    header = b'{"views":[' + b",".join(p.header for p in plans) + b'],"rows":[' + \
        ",".join(str(p.rows.num_rows) for p in plans).encode() + b"]}"
    if len(plans) == 1:
        return header, plans[0].rows
    # one batch of them all (pyarrow 19+ has concat_batches)
    joined = pa.Table.from_batches([p.rows for p in plans]).combine_chunks().to_batches()
    return header, joined[0] if joined else plans[0].rows


def read_answer_message(header: bytes, rows: pa.RecordBatch) -> list[ConstructorPlan]:
    """``answer_message``'s constructor plans, in order."""
    outer = decode(header, "the header of a plans answer")
    heads, counts = outer.get("views"), outer.get("rows")  # "views": the wire's name (``answer_message``)
    if (not isinstance(heads, list) or not heads or not all(isinstance(h, dict) for h in heads)
            or not isinstance(counts, list) or len(counts) != len(heads) or not all(_count(n) for n in counts)
            or sum(counts) != rows.num_rows):
        raise ValueError(f"a plans answer's header must list each plan's header (an object) and row count, "
                         f"covering its {rows.num_rows} rows")
    plans, offset = [], 0
    for head, n in zip(heads, counts):
        plans.append(_plan_of(head, rows.slice(offset, n)))
        offset += n
    return plans


def plan_header(plan: ConstructorPlan) -> dict:
    """A constructor plan's fields other than its samples' columns (``fetch``: the groups as ``[source,
    actor, locations]``). Microbatches that number the samples in row order, one after another (every
    constructor plan made from a step plan's columns), travel as their sizes (``bins``)."""
    sizes = _consecutive_sizes(plan.microbatches)
    header = plan_header_fields(plan.step, plan.axis, plan.broadcast, plan.capacity,
                                [[g.source, g.actor, g.locations] for g in plan.fetch], plan.encoder_axis, plan.extra,
                                sizes, None if plan.encoder is None else {str(b): v for b, v in plan.encoder.items()})
    if sizes is None:
        header["microbatches"] = {str(b): v for b, v in plan.microbatches.items()}
    return header


def plan_header_fields(step: int, axis: str, broadcast: list[str], capacity: int, fetch: list,
                       encoder_axis: str | None, extra: dict, bins: list[list] | None = None,
                       encoder: dict | None = None) -> dict:
    """``plan_header``'s fields; ``bins``: ``[bucket, [samples in each of its microbatches]]`` per bucket,
    in order, the samples numbered in row order (the microbatches then go as ``bins``, not as index
    lists; a list, so that no re-encoding of the JSON object reorders them)."""
    header = {"step": step, "axis": axis, "broadcast": broadcast, "capacity": capacity, "fetch": fetch,
              "encoder_axis": encoder_axis, "encoder": encoder, "extra": extra}
    if bins is not None:
        header["bins"] = bins
    return header


def _consecutive_sizes(microbatches: dict[int, list[list[int]]]) -> list[list] | None:
    """``[bucket, microbatch sizes]`` per bucket, when the microbatches list 0, 1, 2, ... in order; else None."""
    sizes, start = [], 0
    for bucket, mbs in microbatches.items():
        sizes.append([bucket, [len(mb) for mb in mbs]])
        for mb in mbs:
            if mb != list(range(start, start + len(mb))):
                return None
            start += len(mb)
    return sizes


def _microbatches(header: dict, samples: int) -> dict[int, list[list[int]]]:
    """A header's microbatches: as index lists, or rebuilt from ``bins`` (rows past them: samples only
    an encoder row names)."""
    if "bins" not in header:
        return {int(b): v for b, v in header["microbatches"].items()}
    microbatches, start = {}, 0
    for entry in header["bins"]:
        if (not isinstance(entry, list) or len(entry) != 2 or not _count(entry[0]) or not isinstance(entry[1], list)
                or not all(_count(n) for n in entry[1])):
            raise ValueError(f"a constructor plan's bins must be [bucket, [samples per microbatch]] pairs of "
                             f"non-negative integers, got {entry!r}"[:300])
        bucket, sizes = entry
        microbatches[bucket] = []
        for n in sizes:
            microbatches[bucket].append(list(range(start, start + n)))
            start += n
    if start > samples:
        raise ValueError(f"a constructor plan's bins hold {start} samples, its rows only {samples}")
    return microbatches


def _count(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def encoded_plan_schema() -> pa.Schema:
    return load_schema(ENCODED_PLAN)


def plan_rows(columns: list) -> pa.RecordBatch:
    """The ``encoded_plan`` batch of its columns, in schema order, each made as its field's type."""
    return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, encoded_plan_schema())],
                                      schema=encoded_plan_schema())
