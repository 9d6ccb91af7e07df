"""Dynamic CP groups (distribute('HDP')): group sizes, placement rules, the checker, the Planner's
plans and a rank's shards (pure; the cluster end to end is tests/integration/test_hdp.py)."""
from __future__ import annotations

import numpy as np
import pytest

from flight_overlord.config import load_config
from flight_overlord.constructor.assembly import Sample
from flight_overlord.constructor.hdp import hdp_rank_table, shard
from flight_overlord.core import hdp
from flight_overlord.core.context_parallel import reassemble
from flight_overlord.core.mesh import Delivery
from flight_overlord.core.mixing import Mixer
from flight_overlord.core.order import RowGroupRef
from flight_overlord.planner.feed import SourceFeed
from flight_overlord.planner.program import plan_step
from flight_overlord.planner.strategy import Strategy

from ..helpers import write_config


def long_tail(rng, n: int, longest: int) -> np.ndarray:
    """Mostly short samples, a few up to ``longest``."""
    body = np.exp(rng.normal(np.log(300), 1.0, n))
    tail = np.exp(rng.uniform(np.log(longest / 16), np.log(longest), n))
    return np.clip(np.where(rng.random(n) < 0.05, tail, body), 1, longest).astype(np.int64)


def test_group_sizes_are_powers_of_two_from_the_length():
    lengths = np.array([1, 100, 1000, 1001, 2000, 2001, 4000, 7999, 8000])
    assert hdp.group_sizes(lengths, 8, 1000).tolist() == [1, 1, 1, 2, 2, 4, 4, 8, 8]
    assert hdp.group_sizes(lengths, 8, 1000, min_cp=2).tolist() == [2, 2, 2, 2, 2, 4, 4, 8, 8]
    # THD padding counts: 1999 tokens on 2 ranks take a slot of 2000 -> 1000 each; 2003 needs 4
    assert hdp.group_sizes([1999, 2000, 2003], 8, 1001).tolist() == [2, 2, 4]
    with pytest.raises(ValueError, match="sample 1 has 8001 tokens.*8000"):
        hdp.group_sizes([10, 8001], 8, 1000)
    assert hdp.max_group(6) == 4 and hdp.longest_sample(6, 1000) == 4000


@pytest.mark.parametrize("domain, microbatches", [(8, 4), (4, 2), (6, 3), (16, 1)])
def test_random_steps_keep_every_rule(domain, microbatches):
    rng = np.random.default_rng(domain * 10 + microbatches)
    capacity = 4096
    for trial in range(15):
        lengths = long_tail(rng, int(rng.integers(5, 200)), hdp.longest_sample(domain, capacity))
        costs = lengths + lengths.astype(float) ** 2 / 2048
        min_cp = int(rng.choice([1, 1, 2]))
        p = hdp.place(costs, lengths, domain, microbatches, capacity, min_cp)
        hdp.check(p.bins, p.unplaced, lengths, domain, microbatches, capacity, min_cp)  # raises on a broken rule
        shard_tokens = hdp.slots(lengths, p.groups) // p.groups
        for b, items in enumerate(p.bins):  # capacity, and every item with its group's geometry
            assert shard_tokens[items].sum() <= capacity
            rank, m = divmod(b, microbatches)
            for i in items:
                assert p.microbatch[i] == m and p.first[i] <= rank < p.first[i] + p.groups[i]
                assert p.first[i] % p.groups[i] == 0
        placed = np.flatnonzero(p.first >= 0)
        copies = np.bincount(np.concatenate(p.bins), minlength=len(lengths))
        assert np.array_equal(copies[placed], p.groups[placed])  # one shard per group member, no more
        assert (copies[p.unplaced] == 0).all()
        # long samples whole: their shards add up to the padded sequence, never a truncation
        assert (shard_tokens[placed] * p.groups[placed] >= lengths[placed]).all()
        # deterministic
        again = hdp.place(costs, lengths, domain, microbatches, capacity, min_cp)
        assert all(np.array_equal(a, b) for a, b in zip(p.bins, again.bins))


def test_balance_close_to_the_bound_and_short_samples_stay_alone():
    rng = np.random.default_rng(3)
    domain, m, capacity = 8, 4, 8192
    lengths = long_tail(rng, 4000, hdp.longest_sample(domain, capacity))
    lengths = lengths[np.cumsum(lengths) <= 0.85 * domain * m * capacity]
    costs = lengths + lengths.astype(float) ** 2 / 4096
    p = hdp.place(costs, lengths, domain, m, capacity)
    assert len(p.unplaced) == 0
    assert (p.groups[lengths <= capacity] == 1).all() and (p.groups[lengths > capacity] > 1).all()
    per_mb_bound = costs.sum() / domain  # no step beats all the work spread evenly over the domain
    assert p.step_time() < 1.15 * per_mb_bound


def test_widening_spreads_a_heavy_sample_and_keeps_short_ones_alone():
    rng = np.random.default_rng(11)
    lengths = np.concatenate([[12000], rng.integers(50, 600, 100)])  # one long sample, many short
    costs = lengths + lengths.astype(float) ** 2 / 1024
    minimal = hdp.place(costs, lengths, 8, 2, 4096, widen=False)
    wide = hdp.place(costs, lengths, 8, 2, 4096)
    assert minimal.groups.tolist() == hdp.group_sizes(lengths, 8, 4096).tolist() and minimal.groups[0] == 4
    assert wide.groups[0] == 8 and (wide.groups[1:] == 1).all()
    for p in (minimal, wide):
        hdp.check(p.bins, p.unplaced, lengths, 8, 2, 4096)
        assert len(p.unplaced) == 0
    assert wide.step_time() < minimal.step_time()


def test_the_checker_names_what_is_wrong():
    lengths = np.array([1500, 200, 400])  # capacity 1000: sample 0 needs a group of 2
    ok = [[0, 1], [], [0], [2]]  # domain 2 x microbatches 2: bins[rank * 2 + m]
    hdp.check(ok, [], lengths, 2, 2, 1000)
    cases = [
        ([[0, 1], [], [2], [0]], "spread over microbatches"),
        ([[0, 1], [], [], [2]], "on 1 ranks; its group must be a power of two >= 2"),
        ([[0, 1, 2], [], [0], []], "over max_tokens_per_rank"),
        ([[0, 1], [], [0], []], "sample 2 is neither placed nor unplaced"),
        ([[0, 1, 1], [], [0], [2]], "holds a sample twice"),
    ]
    for bins, message in cases:
        with pytest.raises(ValueError, match=message):
            hdp.check(bins, [], lengths, 2, 2, 1000)
    with pytest.raises(ValueError, match=r"the ranks \[k\*2, \(k\+1\)\*2\)"):
        hdp.check([[], [], [0], [], [0], [], [], []], [1, 2], lengths, 4, 2, 1000)
    with pytest.raises(ValueError, match="both placed and unplaced"):
        hdp.check(ok, [1], lengths, 2, 2, 1000)


def test_bad_parameters_and_combinations_are_clear_errors(tmp_path, corpus):
    def strategy(**overrides):
        return Strategy(load_config(write_config(tmp_path, corpus, **overrides)))

    base = {"mesh": {"dp": 2, "cp": 2}}
    for kwargs, message in [({"max_tokens_per_rank": 0}, "max_tokens_per_rank must be an integer >= 1"),
                            ({"min_cp": 3}, "min_cp must be a power of two"),
                            ({"group_size": 2}, "group_size does not apply")]:
        with pytest.raises(ValueError, match=message):
            strategy(**base).distribute("HDP", **kwargs)
    with pytest.raises(ValueError, match="apply to 'HDP' only"):
        strategy(**base).distribute("DP", max_tokens_per_rank=512)
    with pytest.raises(ValueError, match="min_cp=8 is larger than the largest group"):
        strategy(**base).distribute("HDP", min_cp=8).plan()
    with pytest.raises(ValueError, match="broadcast_at\\('CP'\\)"):
        strategy(**base).distribute("HDP").broadcast_at("CP").plan()
    with pytest.raises(ValueError, match="context_length 1024 tokens do not fit"):
        strategy(**base).distribute("HDP", max_tokens_per_rank=200).plan()
    with pytest.raises(ValueError, match="unknown axis 'HDP'"):
        strategy(**base).images().distribute("HDP")
    s = strategy(**base).distribute("HDP").plan()
    assert (s.num_buckets, s.capacity, s.max_sample_tokens) == (4, 512, 1024)


def _feeds(longest: int, rows: int = 6000):
    rng = np.random.default_rng(5)
    fetch = lambda epoch, rg: {"num_tokens": long_tail(rng, rg.num_rows, longest)}  # noqa: E731
    return {"longdocs": SourceFeed("longdocs", [RowGroupRef("longdocs.parquet", 0, rows)], 0, fetch)}


def test_planner_steps_under_hdp_are_checked_and_reproducible(tmp_path, corpus):
    batch = {"context_length": 8192, "microbatches": 2, "tokens_per_step": 24000}
    cfg = load_config(write_config(tmp_path, corpus, mesh={"dp": 2, "cp": 2}, global_batch=batch))
    runs = []
    for _ in range(2):
        strategy = Strategy(cfg).cost("attention", a=1.0, b=1 / 2048).distribute("HDP", max_tokens_per_rank=2048).plan()
        feeds, mixer = _feeds(8192), Mixer(["longdocs"])
        runs.append([plan_step(step, feeds, mixer, strategy, {"longdocs": 1.0}) for step in range(6)])
    first, second = runs
    for a, b in zip(first, second):
        assert [[p.ref.key for p in x] for x in a.bins] == [[p.ref.key for p in x] for x in b.bins]
    seen = set()
    for plan in first:
        assert plan.axis == "HDP" and plan.num_buckets == 4 and plan.capacity == 2048
        keys = sorted({p.ref.key for b in plan.bins for p in b})
        assert not seen & set(keys)  # every sample in one step only
        seen |= set(keys)
        index = {k: i for i, k in enumerate(keys)}
        lengths = np.zeros(len(keys), np.int64)
        for b in plan.bins:
            for p in b:
                lengths[index[p.ref.key]] = p.tokens
        hdp.check([[index[p.ref.key] for p in b] for b in plan.bins], [], lengths, 4, 2, 2048)
        assert lengths.max() > 2048  # long samples planned whole on groups, not truncated to a rank
        stats = plan.stats["hdp"]
        assert stats["cp_tokens"] > 0 and 0 <= stats["idle_fraction"] < 1 and set(stats["groups"]) >= {"1"}


def test_journaled_hdp_plan_gives_the_same_groups(tmp_path, corpus):
    """A restarted Planner serves a step from its journal record: the groups read back from its bins
    (what each constructor receives) must be the ones planned."""
    from flight_overlord.planner.hdp import hdp_groups
    from flight_overlord.planner.program import StepPlan

    batch = {"context_length": 8192, "microbatches": 2, "tokens_per_step": 24000}
    cfg = load_config(write_config(tmp_path, corpus, mesh={"dp": 2, "cp": 2}, global_batch=batch))
    strategy = Strategy(cfg).distribute("HDP", max_tokens_per_rank=2048).plan()
    plan = plan_step(0, _feeds(8192), Mixer(["longdocs"]), strategy, {"longdocs": 1.0})
    again = StepPlan.from_record(plan.to_record())
    assert hdp_groups(again, range(4)) == hdp_groups(plan, range(4))
    assert any(g > 1 for b in hdp_groups(plan, range(4)).values() for mb in b for g, _ in mb)


@pytest.mark.parametrize("size", [1, 2, 4, 8])
def test_shards_reassemble_the_sequence_with_its_labels(size):
    rng = np.random.default_rng(size)
    tokens = rng.integers(1, 30000, size=int(rng.integers(50, 500))).astype(np.int32)
    pieces, labels, positions = [], [], []
    for rank in range(size):
        ids, pos, lab, ranges, slot = shard(Sample("s:f:0:0", tokens), size, rank, pad_token_id=0)
        assert len(ids) == slot // size and ranges[1] - ranges[0] == ranges[3] - ranges[2] or size == 1
        pieces.append((ids, ranges))
        labels.append((lab, ranges))
        positions.append((pos, ranges))
    full = reassemble(pieces, slot)
    assert np.array_equal(full[:len(tokens)], tokens) and (full[len(tokens):] == 0).all()
    full_labels = reassemble(labels, slot)
    assert np.array_equal(full_labels[:len(tokens) - 1], tokens[1:]) and (full_labels[len(tokens) - 1:] == -100).all()
    assert np.array_equal(reassemble(positions, slot)[:len(tokens)], np.arange(len(tokens)))


def test_rank_table_columns(corpus, tmp_path):
    cfg = load_config(write_config(tmp_path, corpus, mesh={"dp": 2, "cp": 2}))
    a, b = Sample("s:a:0:0", np.arange(1, 11, dtype=np.int32)), Sample("s:b:0:1", np.arange(1, 8, dtype=np.int32))
    # rank 1 of the domain: sample a on the group [0, 2) (its CP rank 1), sample b whole
    table = hdp_rank_table(3, 1, [[(a, 2, 0), (b, 1, 1)]], Delivery(1, None), cfg)
    row = table.to_pylist()[0]
    assert row["sample_keys"] == ["s:a:0:0", "s:b:0:1"]
    assert (row["seq_cp_size"], row["seq_cp_rank"], row["seq_cp_first"]) == ([2, 1], [1, 0], [0, 1])
    assert row["cu_seqlens"] == [0, 10, 17] and row["cu_seqlens_padded"] == [0, 12, 19]
    assert row["token_ranges"] == [3, 6, 6, 9, 0, 7, 7, 7] and row["cu_local"] == [0, 6, 13]
    assert row["input_ids"] == [4, 5, 6, 7, 8, 9] + list(range(1, 8)) and row["num_tokens"] == 13
    meta = hdp_rank_table(3, 1, [[(a, 2, 0)]], Delivery(1, None, frozenset()), cfg).to_pylist()[0]
    assert meta["input_ids"] == [] and meta["token_ranges"] == [] and meta["seq_cp_size"] == [2]


def test_shipped_long_context_config_plans_hdp(tmp_path):
    import pathlib

    import yaml

    from flight_overlord.demo.long_tail import make_long_tail
    from flight_overlord.planner.strategy import load_strategy

    configs = pathlib.Path(__file__).resolve().parents[2] / "configs"
    raw = yaml.safe_load((configs / "long_context_hdp.yaml").read_text())
    make_long_tail(tmp_path / "data", "longtail_256k", rows=64, max_tokens=262144, files=2)
    raw.update(data_root=str(tmp_path / "data"), run_dir=str(tmp_path / "run"))
    raw["strategy"]["file"] = str(configs / raw["strategy"]["file"])
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    s = load_strategy(load_config(tmp_path / "c.yaml"))
    assert (s.axis, s.num_buckets, s.capacity, s.max_sample_tokens) == ("HDP", 8, 32768, 262144)
