"""Orchestration logic without servers: the mesh (ClientPlaceTree), context-parallel splits, mixing
schedules and feedback, and the step program over synthetic feeds with strategy primitives and hooks.
End to end on real servers: tests/integration/test_orchestration.py."""
from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest

from flight_overlord.config import ConfigError, load_config
from flight_overlord.core import balance
from flight_overlord.core.context_parallel import reassemble, token_ranges
from flight_overlord.core.mesh import Coord, Mesh
from flight_overlord.core.mixing import Mixer
from flight_overlord.core.order import RowGroupRef, row_permutation
from flight_overlord.core.schedules import FeedbackLog, cosine, dynamic, linear, loss_weighted, staged, weights_at
from flight_overlord.core.stages import ALL_FIELDS, StageContents
from flight_overlord.planner.feed import SourceFeed
from flight_overlord.planner.program import plan_step, sample_meta
from flight_overlord.planner.strategy import Strategy, load_strategy

from ..helpers import write_config


# -- ClientPlaceTree -------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 1, 1), (1, 2, 2, 2), (2, 2, 2, 2), (3, 1, 4, 2)])
@pytest.mark.parametrize("order", [("tp", "cp", "dp", "pp"), ("dp", "tp", "pp", "cp")])
def test_rank_coordinate_round_trip(shape, order):
    mesh = Mesh(*shape, order=order)
    coords = [mesh.coord(r) for r in range(mesh.world_size)]
    assert len(set(coords)) == mesh.world_size
    assert [mesh.rank(c) for c in coords] == list(range(mesh.world_size))
    fastest = order[0]
    assert [getattr(mesh.coord(r), fastest) for r in range(min(mesh.size(fastest), mesh.world_size))] == \
        list(range(mesh.size(fastest)))


def test_megatron_order_and_buckets():
    mesh = Mesh(pp=2, dp=2, cp=2, tp=2)
    assert mesh.coord(0) == Coord(0, 0, 0, 0) and mesh.coord(1) == Coord(0, 0, 0, 1)  # tp fastest
    assert mesh.coord(2) == Coord(0, 0, 1, 0) and mesh.coord(4) == Coord(0, 1, 0, 0) and mesh.coord(8).pp == 1
    assert mesh.num_buckets("DP") == 2 and mesh.num_buckets("CP") == 4 and mesh.num_buckets("WORLD") == 16
    for rank in range(16):
        c = mesh.coord(rank)
        assert mesh.bucket_of(rank, "DP") == c.dp
        assert mesh.bucket_of(rank, "CP") == c.dp * 2 + c.cp
        for axis in ("DP", "CP", "WORLD"):  # a bucket is always assembled where its ranks' dp group is
            assert mesh.dp_of_bucket(mesh.bucket_of(rank, axis), axis) == c.dp
    with pytest.raises(ValueError, match="unknown distribution axis 'EP'"):
        mesh.num_buckets("EP")


FIRST_STAGE = frozenset({"input_ids", "position_ids", "pixel_values"})
LAST_STAGE = frozenset({"labels", "loss_mask"})


def test_stage_contents_default_to_megatrons_and_are_configurable():
    default = StageContents()
    assert default.fields(0, 1) == ALL_FIELDS  # one stage is first and last
    assert [default.fields(s, 4) for s in range(4)] == [FIRST_STAGE, frozenset(), frozenset(), LAST_STAGE]
    mtp = StageContents.of(last=["labels", "loss_mask", "input_ids", "position_ids"], middle="position_ids")
    assert mtp.first == FIRST_STAGE and mtp.fields(1, 3) == {"position_ids"}
    assert mtp.fields(2, 3) == {"labels", "loss_mask", "input_ids", "position_ids"}
    with pytest.raises(ValueError, match=r"pipeline_stages\(last=...\): unknown field\(s\) 'tokens'"):
        StageContents.of(last=["tokens"])
    with pytest.raises(ValueError, match="stage 2 is outside 0..1"):
        default.fields(2, 2)
    deliveries = {Mesh(pp=3).delivery(r, "DP", stages=mtp).key for r in range(3)}
    assert len(deliveries) == 3  # each stage its own table at the constructor


def test_ranks_behind_a_silent_broadcast_do_not_read():
    mesh = Mesh(pp=2, dp=1, cp=2, tp=2)
    readers = [r for r in range(mesh.world_size) if mesh.reads(r, frozenset({"TP"}))]
    assert readers == [r for r in range(mesh.world_size) if mesh.coord(r).tp == 0]
    assert all(mesh.reads(r, frozenset()) for r in range(mesh.world_size))


def test_delivery_rules_follow_the_tree():
    mesh = Mesh(pp=2, dp=2, cp=2, tp=2)
    for rank in range(16):
        c = mesh.coord(rank)
        plain = mesh.delivery(rank, "DP")
        stage = FIRST_STAGE if c.pp == 0 else LAST_STAGE  # what Megatron's stages read
        assert plain.fields == stage and plain.tokens
        assert plain.cp_rank == c.cp        # each CP rank its share of the sequence
        tp = mesh.delivery(rank, "DP", frozenset({"TP"}))
        assert tp.fields == (stage if c.tp == 0 else frozenset())
        cp_bcast = mesh.delivery(rank, "DP", frozenset({"CP"}))
        assert cp_bcast.cp_rank is None and cp_bcast.fields == (stage if c.cp == 0 else frozenset())
        hybrid = mesh.delivery(rank, "CP")
        assert hybrid.cp_rank is None and hybrid.bucket == c.dp * 2 + c.cp
        world = mesh.delivery(rank, "WORLD")
        assert world.tokens and world.bucket == rank


# -- context parallelism ---------------------------------------------------------------
@pytest.mark.parametrize("mode", ["contiguous", "load_balanced"])
@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_cp_split_reassembles_to_the_sequence(mode, cp):
    length = 24 * cp
    sequence = np.random.default_rng(cp).integers(0, 1000, length).astype(np.int32)
    pieces = []
    for c in range(cp):
        ranges = token_ranges(length, cp, c, mode)
        values = np.concatenate([sequence[a:b] for a, b in zip(ranges[::2], ranges[1::2])])
        assert len(values) == length // cp
        pieces.append((values, ranges))
    assert np.array_equal(reassemble(pieces, length), sequence)
    if mode == "load_balanced":  # causal attention work (position + 1 per token) is equal on every rank
        work = [sum(np.arange(a, b).sum() + (b - a) for a, b in zip(r[::2], r[1::2])) for _, r in pieces]
        assert len(set(work)) == 1


def test_cp_split_rejects_uneven_lengths():
    with pytest.raises(ValueError, match="not divisible into 4 chunks"):
        token_ranges(10, 2, 0, "load_balanced")


# -- schedules ---------------------------------------------------------------------------
def test_schedules():
    a, b = {"x": 1.0, "y": 0.0}, {"x": 0.0, "y": 1.0}
    s = staged([(10, b), (0, a)])
    assert s.weights(0) == a and s.weights(9) == a and s.weights(10) == b and s.weights(10**6) == b
    lin = linear(a, b, start=10, end=20)
    assert lin.weights(0) == a and lin.weights(15) == {"x": 0.5, "y": 0.5} and lin.weights(25) == b
    cos = cosine(a, b, start=0, end=10)
    assert cos.weights(5)["y"] == pytest.approx(0.5) and cos.weights(2)["y"] < lin.weights(12)["y"]
    with pytest.raises(ValueError, match="first stage must start at step 0"):
        staged([(5, a)])
    with pytest.raises(ValueError, match="lag must be >= 1"):
        dynamic(loss_weighted(a), lag=0)


def test_feedback_is_order_independent_and_lagged():
    reports = [(0, 0, {"x": 2.0}), (0, 1, {"x": 4.0, "y": 1.0}), (1, 1, {"x": 1.0}), (1, 0, {"x": 1.0})]
    logs = []
    for perm in itertools.permutations(reports):
        log = FeedbackLog(expected=2)
        for step, group, losses in perm:
            log.add(step, group, losses)
        logs.append((log.losses(0), log.losses(1)))
    assert all(x == logs[0] for x in logs) and logs[0][0] == {"x": 3.0, "y": 1.0}
    log = FeedbackLog(expected=2)
    log.add(0, 0, {"x": 1.0})
    assert not log.complete(0) and not log.add(0, 0, {"x": 9.0})  # a retried report does not count twice
    schedule = dynamic(loss_weighted({"x": 1.0, "y": 1.0}), lag=3)
    assert weights_at(schedule, 2, log) == ({"x": 1.0, "y": 1.0}, None)  # no feedback yet
    log.add(0, 1, {"x": 3.0, "y": 1.0})
    weights, used = weights_at(schedule, 3, log)
    assert used == {"x": 2.0, "y": 1.0} and weights["x"] > weights["y"]



def test_feedback_kept_is_bounded_in_steps():
    """A long run keeps only the reports a plan may still read: older ones are dropped and refused."""
    log = FeedbackLog(expected=1)
    for step in range(5000):
        log.add(step, 0, {"x": float(step)})
        log.forget_before(step - 3)
    assert sorted(log.reports) == [4996, 4997, 4998, 4999]
    assert not log.add(10, 0, {"x": 1.0}) and 10 not in log.reports  # a late report of a forgotten step
    assert log.losses(4997) == {"x": 4997.0} and log.complete(4999)


# -- the program, pure (feeds over synthetic metadata) ----------------------------------
def _feeds(lengths: dict[str, int], rows: int = 4000):
    def fetch(source):
        rng = np.random.default_rng(abs(hash(source)) % 2**32)
        return lambda epoch, rg: {"num_tokens": rng.integers(1, lengths[source] + 1, rg.num_rows)}
    return {s: SourceFeed(s, [RowGroupRef(f"{s}.parquet", 0, rows)], 0, fetch(s)) for s in lengths}


def _strategy(tmp_path, corpus, **overrides) -> Strategy:
    return Strategy(load_config(write_config(tmp_path, corpus, **overrides)))


def test_realized_mixture_follows_staged_and_curriculum_schedules(tmp_path, corpus):
    sources = {"captions": 64, "longdocs": 900, "code": 300}
    first, second = {"captions": 0.8, "longdocs": 0.1, "code": 0.1}, {"captions": 0.1, "longdocs": 0.6, "code": 0.3}
    for schedule in (staged([(0, first), (20, second)]), linear(first, second, start=0, end=40)):
        strategy = _strategy(tmp_path, corpus).mix(schedule)
        feeds, mixer = _feeds(sources), Mixer(list(sources))
        realized = collections.defaultdict(lambda: collections.Counter())
        for step in range(40):
            plan = plan_step(step, feeds, mixer, strategy, schedule.weights(step))
            realized[step // 10].update(plan.stats["tokens"])
        for window, tokens in realized.items():  # each 10-step window against its mean weights
            expected = collections.Counter()
            for step in range(window * 10, window * 10 + 10):
                expected.update(schedule.weights(step))
            for source in sources:
                share, want = tokens[source] / sum(tokens.values()), expected[source] / 10
                assert abs(share - want) < 0.03, (type(schedule).__name__, window, source, share, want)


def test_group_size_balances_within_groups_and_keep_global_batch(tmp_path, corpus):
    batch = {"context_length": 1024, "microbatches": 2, "tokens_per_step": 14000}
    strategy = (_strategy(tmp_path, corpus, mesh={"dp": 8}, global_batch=batch)
                .distribute("DP", group_size=4).balance("karmarkar_karp"))
    plan = plan_step(0, _feeds({"captions": 64, "longdocs": 900}), Mixer(["captions", "longdocs"]), strategy,
                     {"captions": 0.5, "longdocs": 0.5})
    assert plan.num_buckets == 8 and len(plan.bins) == 16
    assert plan.stats["max_rank_cost"] < 1.05 * plan.stats["lower_bound"] < plan.stats["max_rank_cost_unbalanced"]
    with pytest.raises(ValueError, match="group size must divide"):
        _strategy(tmp_path, corpus, mesh={"dp": 8}).distribute("DP", group_size=3).plan()
    tight = _strategy(tmp_path, corpus, global_batch={"context_length": 1024, "microbatches": 1,
                                                      "tokens_per_step": 2040})
    tight = tight.balance("greedy", keep_global_batch=True)
    with pytest.raises(ValueError, match="keep_global_batch forbids deferring"):
        for step in range(20):
            plan_step(step, _feeds({"longdocs": 1000}), Mixer(["longdocs"]), tight, {"longdocs": 1.0})


@pytest.mark.parametrize("method", ["greedy", "karmarkar_karp"])
def test_group_size_places_every_sample_once_balances_each_group_and_repeats(tmp_path, corpus, method):
    """distribute(group_size=4) over 16 ranks: 4 groups of 4 ranks, each balanced on its own. Every
    sample a feed handed out is placed exactly once over the steps (or still waits, deferred), each
    group's heaviest rank is close to that group's lower bound, the groups carry similar loads, and
    the same seed plans the same steps."""
    lengths = {"captions": 64, "longdocs": 900, "code": 300}
    weights = {"captions": 0.4, "longdocs": 0.3, "code": 0.3}
    batch = {"context_length": 4096, "microbatches": 2, "samples_per_step": 160}  # room: cost, not capacity, binds

    def run():
        strategy = (_strategy(tmp_path, corpus, mesh={"dp": 16}, global_batch=batch)
                    .distribute("DP", group_size=4).balance(method))
        feeds, mixer = _feeds(lengths), Mixer(list(lengths))
        return strategy, feeds, [plan_step(step, feeds, mixer, strategy, weights) for step in range(6)]

    strategy, feeds, plans = run()
    assert [p.to_record() for p in plans] == [p.to_record() for p in run()[2]]
    placed = [p.ref.key for plan in plans for b in plan.bins for p in b]
    waiting = [f"{s}:{item[1]}:{item[2]}:{item[3]}" for s, f in feeds.items() for item in f.state_dict()["deferred"]]
    handed_out = {f"{s}:{s}.parquet:0:{r}" for s, f in feeds.items()
                  for r in row_permutation(f.row_groups[0], seed=0, source=s, epoch=0)[:f.row_index].tolist()}
    assert len(placed) == len(set(placed)) and not set(placed) & set(waiting)
    assert set(placed) | set(waiting) == handed_out
    for plan in plans:
        costs = np.asarray(strategy.cost_fn(sample_meta(plan.table)))
        loads = np.array([costs[np.concatenate(plan.bin_indices[b * 2:b * 2 + 2])].sum() for b in range(16)])
        groups = loads.reshape(4, 4)
        for g in range(4):
            members = np.concatenate(plan.bin_indices[g * 8:(g + 1) * 8])
            assert groups[g].max() <= 1.05 * balance.lower_bound(costs[members], 4)
        assert groups.sum(axis=1).max() <= 1.05 * groups.sum(axis=1).mean()


def test_plan_raw_hook_and_its_checks(tmp_path, corpus):
    seen = {}

    def round_robin(ctx):  # a user's own placement: sample i to bin i mod k, skipping full bins
        seen["picks"] = ctx.picks
        bins = [[] for _ in range(ctx.num_buckets * ctx.microbatches)]
        used, left = np.zeros(len(bins)), []
        for i, size in enumerate(ctx.sizes):
            b = i % len(bins)
            if used[b] + size <= ctx.capacity:
                bins[b].append(i)
                used[b] += size
            else:
                left.append(i)
        return bins, left
    strategy = _strategy(tmp_path, corpus).plan_raw(round_robin)
    plan = plan_step(0, _feeds({"code": 300}), Mixer(["code"]), strategy, {"code": 1.0})
    k = len(plan.bins)
    for b, bin_ in enumerate(plan.bins):
        assert bin_ and all(seen["picks"].index(p) % k == b for p in bin_)
    assert all(sum(p.tokens for p in b) <= plan.capacity for b in plan.bins)
    bad = _strategy(tmp_path, corpus).plan_raw(lambda ctx: ([[0, 0]] + [[]] * 3, []))
    with pytest.raises(ValueError, match="exactly once"):
        plan_step(0, _feeds({"code": 300}), Mixer(["code"]), bad, {"code": 1.0})


def test_strategy_errors_are_clear(tmp_path, corpus):
    s = _strategy(tmp_path, corpus)
    with pytest.raises(ValueError, match="unknown axis 'PP'"):
        s.distribute("PP")
    with pytest.raises(ValueError, match="unknown method 'zigzag'"):
        s.balance("zigzag")
    with pytest.raises(ValueError, match="unknown cost model 'flops'"):
        s.cost("flops")
    with pytest.raises(ValueError, match="does not apply under distribute"):
        _strategy(tmp_path, corpus).distribute("WORLD").broadcast_at("TP").plan()
    with pytest.raises(ValueError, match=r"broadcast_at\('TP'\): others_read must be true or false, got 'no'"):
        s.broadcast_at("TP", others_read="no")
    with pytest.raises(ValueError, match=r"pipeline_stages\(first=...\): unknown field\(s\) 'pixels'"):
        s.pipeline_stages(first=["input_ids", "pixels"])
    (tmp_path / "nobuild.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="defines no function 'build'"):
        load_strategy(load_config(write_config(tmp_path, corpus, strategy="nobuild.py")))
    with pytest.raises(ConfigError, match="strategy.file: file not found"):
        load_config(write_config(tmp_path, corpus, strategy="missing.py"))
    (tmp_path / "bad.py").write_text("def build(s):\n    return s.mix({'nope': 1.0}).balance('greedy', level='x')\n")
    with pytest.raises(ConfigError, match="bad.py: build\\(\\): balance\\(\\): unknown level 'x'"):
        load_strategy(load_config(write_config(tmp_path, corpus, strategy="bad.py")))


def test_summary_buffer_hook_sees_the_backlog_and_sets_the_mixture(tmp_path, corpus):
    seen = []

    def drain(step, summary, weights):  # only code from step 2 on
        seen.append(summary)
        return {"code": 1.0} if step >= 2 else weights
    strategy = _strategy(tmp_path, corpus).summary_buffer(drain)
    feeds, mixer = _feeds({"captions": 64, "code": 300}), Mixer(["captions", "code"])
    plans = [plan_step(step, feeds, mixer, strategy, {"captions": 0.5, "code": 0.5}) for step in range(4)]
    assert set(plans[0].stats["samples"]) == {"captions", "code"} and set(plans[3].stats["samples"]) == {"code"}
    assert seen[0]["code"] == {"deferred": 0, "deferred_tokens": 0, "drawn": 0} and seen[3]["code"]["drawn"] > 0


def test_balance_equal_size_gives_every_bucket_the_same_count(tmp_path, corpus):
    batch = {"context_length": 4096, "microbatches": 2, "samples_per_step": 64}
    strategy = _strategy(tmp_path, corpus, mesh={"dp": 4}, global_batch=batch).balance("karmarkar_karp",
                                                                                      equal_size=True)
    feeds = _feeds({"captions": 64, "longdocs": 900})
    plan = plan_step(0, feeds, Mixer(["captions", "longdocs"]), strategy, {"captions": 0.5, "longdocs": 0.5})
    assert plan.stats["deferred"] == 0
    assert [len(b) for b in plan.bins] == [8] * 8  # 64 samples over 4 ranks x 2 microbatches


@pytest.mark.parametrize("level", ["both", "intra", "inter"])
def test_one_microbatch_per_rank_keeps_what_each_level_promises(tmp_path, corpus, level):
    """One microbatch per rank (the bucket is its microbatch, no second split): every sample once, no
    microbatch over capacity; where the intra level balances, each microbatch is what partition(k=1)
    gives (by descending cost, ties by index); where it does not, the bucket is left in its order."""
    batch = {"context_length": 2048, "microbatches": 1, "tokens_per_step": 12000}
    strategy = _strategy(tmp_path, corpus, mesh={"dp": 8}, global_batch=batch).balance("greedy", level=level)
    plan = plan_step(0, _feeds({"captions": 64, "longdocs": 900}), Mixer(["captions", "longdocs"]), strategy,
                     {"captions": 0.5, "longdocs": 0.5})
    costs = np.asarray(strategy.cost_fn(sample_meta(plan.table)))
    placed = np.concatenate(plan.bin_indices)
    assert len(plan.bin_indices) == 8 and len(placed) == len(set(placed.tolist()))
    lengths = np.asarray(sample_meta(plan.table)["num_tokens"])
    assert all(lengths[b].sum() <= 2048 for b in plan.bin_indices)
    if level != "inter":
        for b in plan.bin_indices:
            assert b.tolist() == b[balance.partition(costs[b], 1, method="greedy")[0]].tolist()
