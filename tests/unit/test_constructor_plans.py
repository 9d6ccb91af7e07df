"""``planner/constructor_plans.py``: every constructor's plan of a step, from the step plan's columns, byte for
byte the constructor plan an independent builder makes from the step plan's ``Pick`` objects
(``_plan_by_picks`` below, the definition: samples numbered where first met, fetch groups by first sample,
consumers over the whole step), for plain text steps, an image graph, HDP, a sample twice in a step, and each
of them served from the journal."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from flight_overlord.config import load_config
from flight_overlord.core.mixing import Mixer
from flight_overlord.core.order import RowGroupRef
from flight_overlord.planner.constructor_plans import constructor_plans
from flight_overlord.planner.feed import SourceFeed
from flight_overlord.planner.hdp import hdp_groups
from flight_overlord.planner.program import plan_step
from flight_overlord.planner.roster import Roster
from flight_overlord.planner.step_plan import StepPlan
from flight_overlord.planner.strategy import Strategy
from flight_overlord.wire.plan import ConstructorPlan, EncodedPlan, FetchGroup

from ..helpers import WEIGHTS, write_config
from .test_planner_speed import _image_feeds


def _plan_by_picks(plan: StepPlan, constructor: int, mesh, roster, broadcast) -> ConstructorPlan:
    consumers: dict[str, set[int]] = {}
    for k, bin_ in enumerate(plan.bins):
        for p in bin_:
            consumers.setdefault(p.ref.key, set()).add(mesh.constructor_of(mesh.dp_of_bucket(k // plan.microbatches,
                                                                                            plan.axis)))
    for bucket, picks in enumerate(plan.encoder or []):
        for p, _ in picks:
            encoding = mesh.constructor_of(mesh.dp_of_bucket(bucket, plan.encoder_axis))
            consumers.setdefault(p.ref.key, set()).add(encoding)
    index: dict[str, int] = {}
    keys, lengths, fetch = [], [], {}

    def item(pick) -> int:
        ref = pick.ref
        if ref.key not in index:
            index[ref.key] = len(keys)
            actor = roster.owner(ref.source, ref.file, ref.row_group, ref.epoch)
            group = fetch.setdefault(actor, FetchGroup(*actor, roster.locations(actor), [], []))
            group.items.append(len(keys))
            group.samples.append([ref.epoch, ref.file, ref.row_group, ref.row, len(consumers[ref.key])])
            keys.append(ref.key)
            lengths.append(pick.tokens)
        return index[ref.key]

    microbatches = {b: [[item(p) for p in bin_] for bin_ in plan.bucket_bins(b)]
                    for b in mesh.buckets_of_constructor(constructor, plan.axis)}
    encoder = None
    if plan.encoder is not None:
        owner = {p.ref.key: divmod(i, plan.microbatches) for i, bin_ in enumerate(plan.bins) for p in bin_}
        encoder = {b: [[item(p), image, *owner[p.ref.key]] for p, image in plan.encoder[b]]
                   for b in mesh.buckets_of_constructor(constructor, plan.encoder_axis)}
    extra = {"hdp": hdp_groups(plan, microbatches)} if plan.axis == "HDP" else {}
    return ConstructorPlan(plan.step, plan.axis, sorted(broadcast), plan.capacity, keys, lengths, microbatches,
                           list(fetch.values()), plan.encoder_axis, encoder, extra)


def _roster(cfg, strategy, feeds) -> Roster:
    roster = Roster(cfg, strategy.mesh.num_constructors)
    for source, feed in feeds.items():
        roster.register_loader(source, 0, 0, f"grpc://127.0.0.1:{1000 + len(source)}",
                                 [[rg.file, rg.row_group, rg.num_rows] for rg in feed.row_groups])
    return roster


def _assert_plans_match(plan: StepPlan, strategy, roster, broadcast=frozenset()) -> list[EncodedPlan]:
    """The step's constructor plans, and the journaled step's (a restarted Planner's: Picks, no columns), all
    at once and one constructor's alone, equal ``_plan_by_picks``'s, byte for byte."""
    mesh = strategy.mesh
    journaled = StepPlan.from_record(plan.to_record())
    for step in (plan, journaled):
        plans = constructor_plans(step, mesh, roster, broadcast)
        assert len(plans) == mesh.num_constructors
        for c, made in enumerate(plans):
            want = EncodedPlan.of(_plan_by_picks(step, c, mesh, roster, broadcast))
            assert made.header == want.header
            assert made.rows.equals(want.rows)
            alone = constructor_plans(step, mesh, roster, broadcast, [c])[0]
            assert alone.header == want.header and alone.rows.equals(want.rows)
            # through IPC, as the plans stream ships it
            shipped = EncodedPlan(made.header, pa.ipc.read_record_batch(made.rows.serialize(), made.rows.schema))
            assert shipped.plan().to_wire() == want.plan().to_wire()
    return constructor_plans(plan, mesh, roster, broadcast)


@pytest.mark.parametrize("dp_per_constructor", [1, 3])
def test_text_steps_plan_as_by_picks(tmp_path, corpus, dp_per_constructor):
    batch = {"context_length": 2048, "microbatches": 3, "samples_per_step": 12 * 6}
    cfg = load_config(write_config(tmp_path, corpus, global_batch=batch, mesh={"dp": 6},
                                   constructor={"dp_per_constructor": dp_per_constructor}))
    strategy, feeds = Strategy(cfg), _image_feeds()
    roster, mixer = _roster(cfg, strategy, feeds), Mixer(list(WEIGHTS))
    for step in range(3):
        plans = _assert_plans_match(plan_step(step, feeds, mixer, strategy, dict(WEIGHTS)), strategy, roster,
                                    frozenset({"tp"}))
        assert all(p.rows.num_rows for p in plans)
        assert all(c == 1 for p in plans for c in p.rows.column("consumers").to_pylist())


def test_image_graph_steps_plan_as_by_picks(tmp_path, corpus):
    """Images encoded on ranks of another constructor than their sequence's: fetched by both (consumers 2),
    numbered after the constructor plan's microbatch samples."""
    batch = {"context_length": 2048, "microbatches": 2, "tokens_per_step": 60000}
    cfg = load_config(write_config(tmp_path, corpus, global_batch=batch, mesh={"dp": 4, "tp": 2},
                                   constructor={"dp_per_constructor": 1}))
    strategy = Strategy(cfg)
    strategy.images().cost("patches").distribute("WORLD").balance("karmarkar_karp")
    strategy.plan()
    feeds = _image_feeds()
    roster, mixer = _roster(cfg, strategy, feeds), Mixer(list(WEIGHTS))
    weights = {**WEIGHTS, "captions": 3.0, "manuals": 3.0}  # the sources with images
    for step in range(2):
        plan = plan_step(step, feeds, mixer, strategy, weights)
        assert plan.encoder is not None
        plans = _assert_plans_match(plan, strategy, roster)
        assert any(c > 1 for p in plans for c in p.rows.column("consumers").to_pylist())


def _long_feeds(rows: int, longest: int) -> dict[str, SourceFeed]:
    def fetch(epoch, rg):
        rng = np.random.default_rng([epoch, rg.row_group])
        return {"num_tokens": rng.integers(1, longest, rg.num_rows)}
    return {"longdocs": SourceFeed("longdocs", [RowGroupRef("longdocs.parquet", g, rows) for g in range(2)], 0, fetch)}


def test_hdp_steps_plan_as_by_picks(tmp_path, corpus):
    """A sample on a CP group of several ranks sits in each of their bins: numbered once per constructor plan."""
    batch = {"context_length": 8192, "microbatches": 2, "tokens_per_step": 24000}
    cfg = load_config(write_config(tmp_path, corpus, mesh={"dp": 2, "cp": 2}, global_batch=batch))
    strategy = Strategy(cfg).distribute("HDP", max_tokens_per_rank=2048).plan()
    feeds = _long_feeds(3000, 8192)
    roster, mixer = _roster(cfg, strategy, feeds), Mixer(["longdocs"])
    for step in range(2):
        plan = plan_step(step, feeds, mixer, strategy, {"longdocs": 1.0})
        plans = _assert_plans_match(plan, strategy, roster)
        assert any(len(p.plan().keys) < sum(len(mb) for mbs in p.plan().microbatches.values() for mb in mbs)
                   for p in plans)  # some sample met twice in a constructor plan


def test_a_sample_twice_in_a_step_is_numbered_once(tmp_path, corpus):
    """A source smaller than a step wraps into its next epoch: the same row twice in one step."""
    batch = {"context_length": 2048, "microbatches": 2, "samples_per_step": 40}
    cfg = load_config(write_config(tmp_path, corpus, mesh={"dp": 2}, global_batch=batch))
    strategy, feeds = Strategy(cfg), _long_feeds(6, 500)
    roster, mixer = _roster(cfg, strategy, feeds), Mixer(["longdocs"])
    plan = plan_step(0, feeds, mixer, strategy, {"longdocs": 1.0})
    keys = plan.table.keys()
    assert len(set(keys)) < len(keys)
    _assert_plans_match(plan, strategy, roster)


def test_a_journaled_step_keeps_the_epoch_of_each_place_of_a_row_met_twice(tmp_path, corpus):
    """A row met in two epochs of one step is two samples: the journal record (``samples`` keeps one entry
    per row) serves each place again with its own epoch, so a plan dump and a replay agree with what ran."""
    batch = {"context_length": 2048, "microbatches": 2, "samples_per_step": 40}
    cfg = load_config(write_config(tmp_path, corpus, mesh={"dp": 2}, global_batch=batch))
    strategy, feeds = Strategy(cfg), _long_feeds(6, 500)
    plan = plan_step(0, feeds, Mixer(["longdocs"]), strategy, {"longdocs": 1.0})
    placed = [[(p.ref.key, p.ref.epoch) for p in b] for b in plan.bins]
    assert len({key for b in placed for key, _ in b}) < len({pair for b in placed for pair in b})  # two epochs
    for record in (plan.to_record(), StepPlan(**{**vars(plan), "picked": plan.bins}).to_record()):
        journaled = StepPlan.from_record(record)
        assert [[(p.ref.key, p.ref.epoch) for p in b] for b in journaled.bins] == placed
        assert StepPlan.from_record(journaled.to_record()).to_record() == record
