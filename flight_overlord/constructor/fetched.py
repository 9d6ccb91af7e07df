"""A loader's answer as samples, without I/O: how a step's fetch groups go out (one call per loader
process) and how the tables that come back become samples, through the decode stage, in plan order."""
from __future__ import annotations

import pyarrow as pa

from ..config import Config
from ..wire.plan import ConstructorPlan, FetchGroup
from .assembly import Sample, decode_or_error, sample_loss_masks, shipped_images, truncate


def fetch_groups(plan: ConstructorPlan) -> list[list[FetchGroup]]:
    """The plan's fetch groups by the loader process hosting them (same locations): each list is one
    samples call (a Flight call costs both sides CPU)."""
    by_location: dict[tuple[str, ...], list[FetchGroup]] = {}
    for group in plan.fetch:
        by_location.setdefault(tuple(group.locations), []).append(group)
    return list(by_location.values())


def received(cfg: Config, step: int, plan: ConstructorPlan, groups: list[FetchGroup], table: pa.Table) -> list[dict]:
    """One loader process's answer for ``groups`` (their rows back to back): per group, item index ->
    sample (or the failure of its decode)."""
    asked = sum(len(g.samples) for g in groups)
    if table.num_rows != asked:
        raise RuntimeError(f"the loader at {groups[0].locations[0]} returned {table.num_rows} samples for "
                           f"{asked} asked (step {step})")
    out, start = [], 0
    for group in groups:
        out.append(decoded(cfg, plan, group, table.slice(start, len(group.samples))))
        start += len(group.samples)
    return out


def in_plan_order(plan: ConstructorPlan, calls: list[list[FetchGroup]], answers: list[list[dict]]) -> dict:
    """The samples of every call's answer, item index -> sample, in the plan's fetch order (assembly
    reads them in that order, whichever loader process served them)."""
    decoded_groups = {id(g): part for groups, parts in zip(calls, answers) for g, part in zip(groups, parts)}
    samples: dict = {}
    for group in plan.fetch:
        samples.update(decoded_groups[id(group)])
    return samples


def decoded(cfg: Config, plan: ConstructorPlan, group: FetchGroup, table: pa.Table) -> dict:
    """A loader's rows of ``group`` as samples: item -> Sample cut to its planned length (the plan may
    truncate a sample to the capacity), or the failure of its decode."""
    tokens = table.column("tokens").combine_chunks()
    offsets, values = tokens.offsets.to_numpy(), tokens.values.to_numpy()
    if not any(len(chunk.values) for chunk in table.column("images").chunks):  # text only: no decode stage
        masks = sample_loss_masks(table.column("loss_mask").combine_chunks(), offsets)
        return {item: truncate(Sample(plan.keys[item], values[offsets[j]:offsets[j + 1]], loss_mask=masks(j)),
                               plan.lengths[item], cfg)
                for j, item in enumerate(group.items)}
    images, grids = table.column("images").to_pylist(), table.column("image_grids").to_pylist()
    ships = shipped_images(plan.encoder)  # image graph: decode only the images encoded here
    out = {}
    for j, item in enumerate(group.items):
        ids = values[offsets[j]:offsets[j + 1]]
        sample = decode_or_error(plan.keys[item], ids, images[j], grids[j], cfg,
                                 None if ships is None else ships.get(item, set()))
        out[item] = truncate(sample, plan.lengths[item], cfg) if isinstance(sample, Sample) else sample
    return out
