"""The colocated baseline of ``delivery.throughput``, the memory and the training benchmarks: per rank a
torch DataLoader whose workers each open every file of their sources and pack greedily in arrival order
(what a conventional loader does)."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.common.rank_processes import RankChannel, Tally, microbatch_nbytes

# ---------------------------------------------------------------------------------------------
# Side 3: the colocated baseline
# ---------------------------------------------------------------------------------------------

class _ShardReader:
    """One source's row groups of one worker's shard, read, tokenized and shuffled, forever."""

    def __init__(self, name: str, files: list, file_ids: list[str], shard: int, shards: int,
                 context_length: int, rng: np.random.Generator):
        from flight_overlord.transforms import make_transform
        self.name, self.files, self.file_ids = name, files, file_ids
        self.context_length, self.rng = context_length, rng
        self.tokenize = make_transform("byte_tokenizer")
        catalog = [(f, g) for f, pf in enumerate(files) for g in range(pf.num_row_groups)]
        self.row_groups = catalog[shard::shards] or [catalog[shard % len(catalog)]]
        self.order: list[int] = []
        self.buffer: list[tuple[str, np.ndarray]] = []
        self.mean_tokens = None  # of the first row group read: turns token shares into sample odds

    def next(self) -> tuple[str, np.ndarray]:
        while not self.buffer:
            self._read_next_row_group()
        return self.buffer.pop()

    def _read_next_row_group(self) -> None:
        if not self.order:  # a new epoch over this shard, in a new order
            self.order = list(self.rng.permutation(len(self.row_groups)))
        f, g = self.row_groups[self.order.pop()]
        column = self.files[f].read_row_group(g, columns=["text"]).column(0).combine_chunks()
        tokens = self.tokenize(column, self.context_length)
        offsets, values = tokens.offsets.to_numpy(), tokens.values.to_numpy()
        samples = [(f"{self.name}:{self.file_ids[f]}:{g}:{row}", values[offsets[row]:offsets[row + 1]])
                   for row in self.rng.permutation(len(column)) if offsets[row + 1] > offsets[row]]
        if self.mean_tokens is None and samples:
            self.mean_tokens = float(np.mean([len(t) for _, t in samples]))
        self.buffer = samples[::-1]  # pop() from the end = the permuted order


def _make_colocated_dataset(sources, data_dir: str, rank: int, ranks: int, context_length: int,
                            pad_token_id: int, seed: int, samples_per_batch: int = 0):
    import torch
    from torch.utils.data import IterableDataset, get_worker_info

    from flight_overlord.core.packing import pack, shifted_labels

    class ColocatedDataset(IterableDataset):
        """Every worker opens every file of every source and does all the work itself."""

        def __iter__(self):
            import pyarrow.parquet as pq
            info = get_worker_info()
            worker, workers = (info.id, info.num_workers) if info else (0, 1)
            shard, shards = rank * workers + worker, ranks * workers
            readers, weights = [], []
            for index, (name, weight, _) in enumerate(sources):
                paths = sorted((Path(data_dir) / name).glob("*.parquet"))
                files = [pq.ParquetFile(p) for p in paths]  # handles to *all* files, kept open
                ids = [str(p.relative_to(data_dir)) for p in paths]
                rng = np.random.default_rng([seed, rank, worker, index])
                readers.append(_ShardReader(name, files, ids, shard, shards, context_length, rng))
                weights.append(weight)
            # The weights are token shares (as for the Planner's tokens_per_step): per-sample odds
            # are weight / mean sample length, from the first row group read of each source.
            for reader in readers:
                if not reader.buffer:
                    reader._read_next_row_group()
            odds = np.array([w / max(r.mean_tokens or 1.0, 1.0) for w, r in zip(weights, readers)])
            odds /= odds.sum()
            rng = np.random.default_rng([seed, rank, worker, 1 << 20])
            pending, used = [], 0
            while True:
                key, tokens = readers[rng.choice(len(readers), p=odds)].next()
                if samples_per_batch:  # lists of that many (key, tokens) samples, unpacked: the caller packs
                    pending.append((key, np.array(tokens)))
                    if len(pending) == samples_per_batch:
                        yield pending
                        pending = []
                    continue
                if pending and used + len(tokens) > context_length:  # greedy, in arrival order
                    yield self._microbatch(pending)
                    pending, used = [], 0
                pending.append((key, tokens))
                used += len(tokens)

        @staticmethod
        def _microbatch(pending):
            packed = pack([t for _, t in pending], context_length, pad_token_id)
            labels = shifted_labels(packed, None)  # as the constructor makes them
            return {"input_ids": torch.from_numpy(packed.input_ids),
                    "position_ids": torch.from_numpy(packed.position_ids),
                    "labels": torch.from_numpy(labels), "loss_mask": torch.from_numpy((labels != -100).astype(np.int8)),
                    "token_ranges": [0, context_length], "cu_seqlens": torch.from_numpy(packed.cu_seqlens),
                    "cu_seqlens_padded": torch.from_numpy(packed.cu_seqlens_padded),
                    "num_tokens": packed.num_tokens, "sample_keys": [k for k, _ in pending],
                    "pixel_values": None, "image_grid_thw": torch.zeros((0, 3), dtype=torch.int32)}

    return ColocatedDataset()


def colocated_loader(sources, data_dir: str, rank: int, ranks: int, workers: int, context_length: int, seed: int,
                     samples_per_batch: int = 0):
    """Rank ``rank``'s colocated torch DataLoader: an endless stream of packed microbatch dicts
    (``samples_per_batch``: of lists of that many (key, tokens) samples, unpacked)."""
    dataset = _make_colocated_dataset(sources, data_dir, rank, ranks, context_length, 0, seed, samples_per_batch)
    return worker_loader(dataset, workers)


def worker_loader(dataset, workers: int):
    """A torch DataLoader yielding ``dataset``'s items as they are, from ``workers`` forked workers
    (fork: Linux's default, stated because the rank process itself was spawned)."""
    from torch.utils.data import DataLoader
    return DataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=workers > 0,
                      prefetch_factor=2 if workers > 0 else None,
                      multiprocessing_context="fork" if workers > 0 else None)


def baseline_rank(channel: RankChannel, sources, data_dir: str, ranks: int, workers: int,
                  context_length: int, microbatches: int, warmup: int, steps: int, seed: int) -> None:
    loader = colocated_loader(sources, data_dir, channel.rank, ranks, workers, context_length, seed)
    timed_microbatches(channel, loader, microbatches, warmup, steps)


def timed_microbatches(channel: RankChannel, loader, microbatches: int, warmup: int, steps: int) -> None:
    """A rank's steps of ``microbatches`` packed microbatch dicts from ``loader``: warm up, then time."""
    tally = Tally(channel.rank)
    batches = iter(loader)
    for i in range(warmup + steps):
        if i == warmup:
            channel.warm()
            tally.t0 = time.monotonic()
        step = [next(batches) for _ in range(microbatches)]
        if i >= warmup:
            tally.add_step(step, sum(microbatch_nbytes(mb) for mb in step))
    tally.t1 = time.monotonic()
    channel.result(tally)  # the workers stay up until the driver's last PSS sample
    del batches
