"""THD context-parallel shares against a reference of TransformerEngine's per-sequence partition.

The reference follows TransformerEngine's documentation of ``thd_get_partitioned_indices`` (and
Megatron-Core's ``get_batch_on_this_cp_rank`` for THD): with ``cu_seqlens_padded`` giving each
sequence's padded extent (a multiple of 2*cp), rank r takes, for every sequence in order, the
r-th and the (2*cp-1-r)-th of its 2*cp equal chunks. It is written here from that description,
independently of the code under test.
"""
from __future__ import annotations

import numpy as np
import pytest

from flight_overlord.core.context_parallel import reassemble, take_ranges, thd_token_ranges
from flight_overlord.core.packing import pack, round_up, shifted_labels


def te_partitioned_indices(cu_seqlens_padded: list[int], cp: int, rank: int) -> list[int]:
    out = []
    for i in range(len(cu_seqlens_padded) - 1):
        start, seqlen = cu_seqlens_padded[i], cu_seqlens_padded[i + 1] - cu_seqlens_padded[i]
        chunk = seqlen // (2 * cp)
        out += list(range(start + rank * chunk, start + (rank + 1) * chunk))
        out += list(range(start + (2 * cp - 1 - rank) * chunk, start + (2 * cp - rank) * chunk))
    return out


def indices(ranges: list[int]) -> list[int]:
    return [i for a, b in zip(ranges[::2], ranges[1::2]) for i in range(a, b)]


def random_pack(rng: np.random.Generator, cp: int, capacity: int = 512):
    """A random pack of samples, each padded to a multiple of 2*cp, filling at most the capacity."""
    samples, used = [], 0
    while True:
        n = int(rng.integers(1, 90))
        slot = -(-n // (2 * cp)) * (2 * cp)
        if used + slot > capacity or len(samples) >= 12:
            break
        samples.append(rng.integers(1, 30000, size=n).astype(np.int32))
        used += slot
    return samples, pack(samples, capacity, pad_token_id=0, seq_multiple=2 * cp)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_thd_shares_equal_transformer_engines_partition(cp):
    rng = np.random.default_rng(cp)
    for _ in range(60):
        samples, packed = random_pack(rng, cp)
        cu_padded = packed.cu_seqlens_padded.tolist()
        assert cu_padded[-1] == len(packed.input_ids)  # the slots cover the buffer (tail: its own slot)
        tail = len(packed.input_ids) - round_up(len(samples[-1]), 2 * cp) - (cu_padded[len(samples) - 1])
        assert len(cu_padded) == len(samples) + 1 + (tail > 0) == len(packed.cu_seqlens)
        shares = []
        for rank in range(cp):
            ranges = thd_token_ranges(cu_padded, cp, rank)
            assert indices(ranges) == te_partitioned_indices(cu_padded, cp, rank)
            shares.append((take_ranges(packed.input_ids, ranges), ranges))
        assert {len(s) for s, _ in shares} == {len(packed.input_ids) // cp}  # equal shares
        full = reassemble(shares, len(packed.input_ids))
        assert np.array_equal(full, packed.input_ids)  # the shares give back the packed sequence
        for sample, start in zip(samples, cu_padded):
            assert np.array_equal(full[start:start + len(sample)], sample)


@pytest.mark.parametrize("cp", [2, 4])
def test_labels_and_positions_follow_the_shares(cp):
    rng = np.random.default_rng(10 + cp)
    samples, packed = random_pack(rng, cp)
    labels = shifted_labels(packed, None)
    lengths = np.diff(packed.cu_seqlens)
    for sample, start, n in zip(samples, packed.cu_seqlens_padded, lengths):
        assert np.array_equal(packed.position_ids[start:start + n], np.arange(n))
        assert np.array_equal(labels[start:start + n - 1], sample[1:])  # next token of the same sample
        assert labels[start + n - 1] == -100  # a sample's last token predicts nothing
    real = np.zeros(len(labels), dtype=bool)
    for start, n in zip(packed.cu_seqlens_padded, lengths):
        real[start:start + n] = True
    assert np.all(labels[~real] == -100) and np.all(packed.position_ids[~real] == 0)  # padding is ignored
    for rank in range(cp):
        ranges = thd_token_ranges(packed.cu_seqlens_padded, cp, rank)
        # a rank's labels are the labels at its positions: the next token across chunk boundaries too
        assert np.array_equal(take_ranges(labels, ranges), labels[te_partitioned_indices(
            packed.cu_seqlens_padded.tolist(), cp, rank)])


def test_cu_seqlens_count_real_tokens_and_empty_packs():
    packed = pack([np.arange(1, 6), np.arange(1, 4)], 16, seq_multiple=4)
    assert packed.cu_seqlens.tolist() == [0, 5, 8, 8]
    assert packed.cu_seqlens_padded.tolist() == [0, 8, 12, 16]  # 5 -> 8, 3 -> 4, then the tail: its own slot
    full = pack([np.arange(1, 6), np.arange(1, 8)], 16, seq_multiple=4)
    assert full.cu_seqlens.tolist() == [0, 5, 12] and full.cu_seqlens_padded.tolist() == [0, 8, 16]  # no tail
    empty = pack([], 16, seq_multiple=4)
    assert empty.cu_seqlens.tolist() == [0, 0] and empty.cu_seqlens_padded.tolist() == [0, 16]
    plain = pack([np.arange(1, 6)], 16)
    assert plain.cu_seqlens_padded.tolist() == plain.cu_seqlens.tolist() == [0, 5]
    with pytest.raises(ValueError, match="more than the context length"):
        pack([np.arange(5)] * 3, 16, seq_multiple=4)  # 15 real tokens fit, three 8-token slots do not
    with pytest.raises(ValueError, match="not a multiple of 2\\*cp"):
        thd_token_ranges([0, 6], 2, 0)
    with pytest.raises(ValueError, match="sequence length 18 is not a multiple of 4"):
        pack([np.arange(5)], 18, seq_multiple=4)


def real_tokens_per_rank(packed, cp: int) -> np.ndarray:
    """[sequence, cp rank]: the real tokens of each sequence (slot) each CP rank holds."""
    real = np.zeros(len(packed.input_ids), dtype=bool)
    for start, n in zip(packed.cu_seqlens_padded, np.diff(packed.cu_seqlens)):
        real[start:start + n] = True
    slot_of = np.repeat(np.arange(len(packed.cu_seqlens) - 1), np.diff(packed.cu_seqlens_padded))
    out = np.zeros((len(packed.cu_seqlens) - 1, cp), dtype=np.int64)
    for rank in range(cp):
        held = np.array(indices(thd_token_ranges(packed.cu_seqlens_padded, cp, rank)), dtype=np.int64)
        np.add.at(out[:, rank], slot_of[held[real[held]]], 1)
    return out


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_every_sequences_real_tokens_are_split_evenly(cp):
    """The CP ranks' real tokens of every sequence differ by at most that sequence's own padding
    (under 2*cp tokens), however long the buffer's tail padding: the tail is a padding-only slot
    of its own (it used to join the last sample's slot, and the ranks holding that slot's first
    chunks then got most of the last sample, the others its padding)."""
    rng = np.random.default_rng(100 + cp)
    packs = [random_pack(rng, cp, capacity=512)[1] for _ in range(30)]
    # a lot of tail padding: one short sample in a long buffer, and a few in a quarter-filled one
    packs.append(pack([rng.integers(1, 100, size=3 * cp + 1)], 64 * cp, seq_multiple=2 * cp))
    packs.append(pack([rng.integers(1, 100, size=n) for n in (37, 5, 60)], 1024, seq_multiple=2 * cp))
    for packed in packs:
        per_rank = real_tokens_per_rank(packed, cp)
        lengths = np.diff(packed.cu_seqlens)
        slots = np.diff(packed.cu_seqlens_padded)
        assert np.array_equal(per_rank.sum(axis=1), lengths)  # every real token on exactly one rank
        spread = per_rank.max(axis=1) - per_rank.min(axis=1)
        assert np.all(spread <= slots - lengths)  # ranks differ by at most the sequence's padding
        assert np.all(spread < 2 * cp)  # which is the 2*cp rounding only: the tail is not in it
        assert np.all(slots > 0) and np.all(slots % (2 * cp) == 0)
        assert np.all((slots - lengths)[lengths > 0] < 2 * cp)


def test_the_planner_budgets_each_sample_padded_to_its_slot(tmp_path):
    """Under THD with cp=4 every sample takes a multiple of 8 tokens: the plan must fit the padded
    sizes, not the real ones, in each microbatch (else the constructor could not pack it)."""
    from flight_overlord.config import parse_config
    from flight_overlord.planner.planner import Planner
    from flight_overlord.planner.strategy import load_strategy

    (tmp_path / "f.parquet").write_bytes(b"")
    cfg = parse_config({"seed": 3, "run_dir": str(tmp_path / "run"), "data_root": str(tmp_path),
                        "sources": [{"name": "s", "paths": "f.parquet"}], "mesh": {"dp": 2, "cp": 4},
                        "global_batch": {"context_length": 256, "microbatches": 2, "tokens_per_step": 900}},
                       base_dir=tmp_path)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 120, size=40)
    planner = Planner(cfg, load_strategy(cfg), lambda source: lambda epoch, rg: {"num_tokens": lengths})
    planner.open(resume=False)
    planner.roster.register_loader("s", 0, 0, "grpc://127.0.0.1:1", [["f.parquet", g, 40] for g in range(3)])
    planner.start_feeds()
    assert planner.strategy.seq_multiple == 8
    for _ in range(10):
        plan = planner.plan_next()
        for bin_ in plan.bins:
            assert sum(-(-p.tokens // 8) * 8 for p in bin_) <= plan.capacity
    planner.close()


@pytest.mark.parametrize("key, bad", [("context_length", 252), ("pad_to_multiple", 12)])
def test_thd_lengths_must_be_multiples_of_2cp(tmp_path, key, bad):
    """Under THD every slot, the tail's padding-only one included, is a multiple of 2*cp: the
    buffer length must be one too, said clearly at config time."""
    from flight_overlord.config import ConfigError, parse_config

    (tmp_path / "f.parquet").write_bytes(b"")
    batch = {"context_length": 256, "microbatches": 2, "tokens_per_step": 900, key: bad}
    raw = {"run_dir": str(tmp_path / "run"), "data_root": str(tmp_path), "global_batch": batch,
           "sources": [{"name": "s", "paths": "f.parquet"}], "mesh": {"dp": 2, "cp": 4, "cp_format": "thd"}}
    with pytest.raises(ConfigError, match=f"global_batch.{key} {bad} must divide into 8 equal chunks for the thd"):
        parse_config(raw, base_dir=tmp_path)
    batch[key] = 256 if key == "context_length" else 16
    assert parse_config(raw, base_dir=tmp_path).mesh.cp_format == "thd"
