"""One planned step: which samples go into which microbatch of which bucket, and its journal record.

Planning fills a plan from columns (``PickTable`` and one index array per bin); the ``Pick`` lists
of ``bins`` are made only when a caller asks for them (a constructor plan, an image graph, a
test), so a step of 10^5 samples costs no object per sample until then.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.order import SampleRef
from .picks import Pick, PickTable


@dataclass
class StepPlan:
    step: int
    axis: str              # the distribution axis: what a bucket is
    num_buckets: int
    microbatches: int      # per bucket
    capacity: int          # tokens per packed microbatch
    picked: list[list[Pick]] | None  # the bins as Picks when given so (see ``bins``)
    weights: dict[str, float]
    feedback: dict | None = None  # the trainer feedback the weights were computed from
    stats: dict = field(default_factory=dict)
    encoder_axis: str | None = None  # set when an image graph places images apart from their sequences
    encoder: list[list[tuple[Pick, int]]] | None = None  # encoder[bucket]: (sample, image index) it encodes
    table: PickTable | None = None  # the step's samples as columns ...
    bin_indices: list[np.ndarray] | None = None  # ... and each bin's rows of it, in order
    # (key, epoch) of the samples a skipped window's steps would have had, dropped on purpose before this
    # step, the window's first, was planned (``overlord skip``): never delivered
    dropped: list[tuple[str, int]] = field(default_factory=list)

    @classmethod
    def from_table(cls, step: int, axis: str, num_buckets: int, microbatches: int, capacity: int,
                   table: PickTable, bin_indices: list[np.ndarray], weights: dict, feedback: dict | None) -> "StepPlan":
        return cls(step, axis, num_buckets, microbatches, capacity, None, weights, feedback, table=table,
                   bin_indices=bin_indices)

    @property
    def bins(self) -> list[list[Pick]]:
        """bins[bucket * microbatches + m]: the samples of one packed microbatch, in order."""
        if self.picked is None:
            flat = self.table.picks(np.concatenate(self.bin_indices)) if self.bin_indices else []
            ends = np.cumsum([len(b) for b in self.bin_indices]).tolist()
            self.picked = [flat[a:b] for a, b in zip([0] + ends[:-1], ends)]
        return self.picked

    def bucket_bins(self, bucket: int) -> list[list[Pick]]:
        return self.bins[bucket * self.microbatches:(bucket + 1) * self.microbatches]

    def layout(self) -> dict:
        """The shape of the step's bins: a journaled plan is only reused under the same layout."""
        return {"axis": self.axis, "buckets": self.num_buckets, "microbatches": self.microbatches,
                "capacity": self.capacity, "encoder_axis": self.encoder_axis}

    def to_record(self) -> dict:
        """The journal record: enough to serve this plan again without planning it (every sample's
        epoch and planned size are in ``samples``; where a source smaller than a step put one row in it
        in two epochs, ``epochs`` holds each place's epoch, as ``samples`` keeps one per row; a row placed
        in several bins in one epoch, as HDP does, needs none)."""
        if self.picked is None:
            bins, samples = self._table_record()
        else:
            bins, samples = self._picks_record()
        record = {"step": self.step, "layout": self.layout(), "weights": self.weights, "stats": self.stats,
                  "bins": bins, "samples": samples}
        if self.feedback is not None:
            record["feedback"] = self.feedback
        if self.encoder is not None:
            record["encoder"] = [[[p.ref.key, i] for p, i in b] for b in self.encoder]
        epochs = self._bin_epochs()
        keys = [key for placed in bins for key in placed]
        if len(set(zip(keys, (e for placed in epochs for e in placed)))) > len(set(keys)):  # a row in two epochs
            record["epochs"] = epochs
            if self.encoder is not None:
                record["encoder_epochs"] = [[p.ref.epoch for p, _ in b] for b in self.encoder]
        return record

    def _bin_epochs(self) -> list[list[int]]:
        if self.picked is not None:
            return [[p.ref.epoch for p in b] for b in self.picked]
        return [self.table.epoch[b].tolist() for b in self.bin_indices]

    def _picks_record(self) -> tuple[list[list[str]], dict]:
        bins = [[p.ref.key for p in b] for b in self.picked]  # a key is a formatted string: made once per sample
        picks = {key: p for keys, b in zip(bins, self.picked) for key, p in zip(keys, b)}
        if self.encoder is not None:
            picks.update((p.ref.key, p) for b in self.encoder for p, _ in b)
        return bins, {k: [p.ref.epoch, p.tokens, p.patches, list(p.image_sizes)] for k, p in picks.items()}

    def _table_record(self) -> tuple[list[list[str]], dict]:
        """``_picks_record`` from the columns: the same record, without a Pick per sample."""
        t = self.table
        keys = t.keys()
        order = np.concatenate(self.bin_indices) if self.bin_indices else np.zeros(0, dtype=np.int64)
        placed = [keys[i] for i in order.tolist()]
        ends = np.cumsum([len(b) for b in self.bin_indices]).tolist()
        bins = [placed[a:b] for a, b in zip([0] + ends[:-1], ends)]
        sizes = t.image_sizes[order].tolist() if t.image_sizes is not None else [()] * order.size
        samples = {k: [e, n, p, list(s)] for k, e, n, p, s in zip(
            placed, t.epoch[order].tolist(), t.tokens[order].tolist(), t.patches[order].tolist(), sizes)}
        if self.encoder is not None:
            samples.update((p.ref.key, [p.ref.epoch, p.tokens, p.patches, list(p.image_sizes)])
                           for b in self.encoder for p, _ in b if p.ref.key not in samples)
        return bins, samples

    @classmethod
    def from_record(cls, record: dict) -> "StepPlan":
        samples = record["samples"]

        def pick(key: str, epoch: int | None) -> Pick:
            recorded, tokens, patches, sizes = samples[key]
            source, rest = key.split(":", 1)
            file, row_group, row = rest.rsplit(":", 2)
            ref = SampleRef(source, recorded if epoch is None else epoch, file, int(row_group), int(row))
            return Pick(ref, tokens, patches, tuple(sizes))

        def placed(lists: list[list], epochs: list[list[int]] | None) -> list[list]:
            """Each list's entries with their epochs (``epochs``, when the record has them)."""
            epochs = epochs or [[None] * len(entries) for entries in lists]
            return [list(zip(entries, at)) for entries, at in zip(lists, epochs)]

        layout = record["layout"]
        encoder = None
        if record.get("encoder") is not None:
            encoder = [[(pick(k, e), i) for (k, i), e in b]
                       for b in placed(record["encoder"], record.get("encoder_epochs"))]
        bins = [[pick(k, e) for k, e in b] for b in placed(record["bins"], record.get("epochs"))]
        return cls(record["step"], layout["axis"], layout["buckets"], layout["microbatches"], layout["capacity"],
                   bins, record["weights"], record.get("feedback"), record["stats"], layout["encoder_axis"], encoder)
