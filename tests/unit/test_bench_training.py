"""benchmarks.training.end_to_end's pure parts: the simulated compute of a rank (whole sequences and
context-parallel shares) and that every scenario's config is a valid run config."""
from __future__ import annotations

import types

import numpy as np
import pytest

from flight_overlord.config import load_config
from flight_overlord.core.context_parallel import thd_token_ranges, token_ranges
from flight_overlord.core.packing import pack
from flight_overlord.demo.long_tail import long_tail_lengths, make_long_tail


@pytest.fixture(scope="module")
def bt():
    from benchmarks.training import end_to_end
    return end_to_end


@pytest.fixture(scope="module")
def cost():
    """The cost model benchmarks.training.end_to_end simulates a rank's compute with."""
    from benchmarks.training import cost
    return cost


def _packs(seed: int, context: int = 32768, count: int = 12) -> list[list[int]]:
    packs, current = [], []
    for n in long_tail_lengths(4000, context, seed=seed).tolist():
        if sum(current) + n + 8 > context:  # room for per-sequence padding
            packs.append(current)
            current = []
        current.append(n)
    return packs[:count]


def test_backbone_is_a_per_sequence_cost(cost):
    mb = {"cu_seqlens": np.array([0, 100, 4196])}
    assert cost.backbone([mb]) == [pytest.approx(cost.LLM.a * 4196 + cost.LLM.b * (100**2 + 4096**2))]
    assert cost.LLM.b / cost.LLM.a == pytest.approx(12 * 32 * 4096 / (6 * 6.74e9))


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_shares_add_up_to_the_whole_sequence_cost(cost, cp):
    """Each CP layout's shares add up to the unsplit cost plus ring traffic; THD's split of every
    sequence gives equal attention per rank, the whole-buffer split does not."""
    spread = {"bshd": [], "thd": []}
    for seed, lengths in enumerate(_packs(cp)):
        tokens = [np.ones(n, np.int32) for n in lengths]
        whole = cost.LLM.seconds(lengths)
        for fmt in spread:
            packed = pack(tokens, 32768, seq_multiple=2 * cp if fmt == "thd" else 1)
            shares = []
            for rank in range(cp):
                ranges = (thd_token_ranges(packed.cu_seqlens_padded, cp, rank) if fmt == "thd"
                          else token_ranges(32768, cp, rank, "load_balanced"))
                mb = {"cu_seqlens": packed.cu_seqlens, "cu_seqlens_padded": packed.cu_seqlens_padded,
                      "token_ranges": ranges}
                shares.append(cost.context_parallel(cp, [mb])[0])
            comm = cost.CP_PASSES * (cp - 1) * sum(lengths) * cost.KV_BYTES_PER_TOKEN / cost.CP_LINK_BYTES_PER_S
            # causal pairs l(l+1)/2 times 2b: b*l^2 plus b*l per sequence
            assert sum(shares) == pytest.approx(whole + comm + cost.LLM.b * sum(lengths), rel=1e-9)
            spread[fmt].append(max(shares) / np.mean(shares))
    assert np.mean(spread["bshd"]) > np.mean(spread["thd"])


def test_every_scenario_config_is_valid(bt, tmp_path):
    make_long_tail(tmp_path / "data", "longtail_32k", rows=200, max_tokens=32768)
    args = types.SimpleNamespace(ranks=8, prefetch=2)
    for name, scenario in bt.SCENARIOS.items():
        if scenario.corpus != "text":  # the VLM mix needs the image corpus (the vision benchmark's tests cover it)
            continue
        cfg = load_config(bt.overlord_config(args, tmp_path, tmp_path / "data", name, scenario))
        cp = scenario.config.get("mesh", {}).get("cp", 1)
        assert (cfg.mesh.dp, cfg.mesh.cp) == (8 // cp, cp)
        if "cp_format" in scenario.config.get("mesh", {}):  # static CP rows repeat the sequence's count per CP rank
            assert scenario.token_share == 1 / cp
        assert cfg.balance.method == ("none" if "unbalanced" in name else "greedy")
        assert cfg.cost.b == pytest.approx(bt.LLM.b / bt.LLM.a, rel=1e-3)
        assert cfg.prefetch == 2 and cfg.global_batch.context_length == 32768
        if scenario.equal_samples:  # as many samples per rank as carry tokens_per_step on average
            raw = {"sources": [{"name": "longtail_32k"}], "global_batch": {"context_length": 32768,
                                                                         "tokens_per_step": 480000}}
            mean = long_tail_lengths(200, 32768).mean()
            assert bt.samples_per_rank(raw, tmp_path / "data", 8) == round(480000 / 8 / mean)
