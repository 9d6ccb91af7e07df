"""``overlord mix``'s weights (sources not named keep theirs) and ``overlord audit``'s counting and text."""
from __future__ import annotations

import pytest

from flight_overlord.planner.audit import compute_audit, render
from flight_overlord.planner.edits import checked_weights, format_weights, mixed_weights

SOURCES = ["web", "code", "qa"]


def test_sources_not_named_keep_their_weight_unless_only():
    in_force = {"web": 0.5, "code": 0.3, "qa": 0.2}
    assert mixed_weights({"code": 0.6}, in_force, SOURCES, only=False) == {"web": 0.5, "code": 0.6, "qa": 0.2}
    assert mixed_weights({"code": 0.6}, in_force, SOURCES, only=True) == {"web": 0.0, "code": 0.6, "qa": 0.0}
    with pytest.raises(ValueError, match="every source would weigh 0"):
        mixed_weights({"code": 0.0}, in_force, SOURCES, only=True)
    with pytest.raises(ValueError, match="unknown source 'nope'"):
        checked_weights({"nope": 1.0}, SOURCES)
    with pytest.raises(ValueError, match="numbers >= 0"):
        checked_weights({"web": -1.0}, SOURCES)
    assert format_weights({"web": 3.0, "code": 1.0}) == "web=3 (75%) code=1 (25%)"


class FakeRef:
    def __init__(self, key):
        self.key, self.epoch = key, 0


class FakePick:
    def __init__(self, key):
        self.ref, self.tokens = FakeRef(key), 10


class Plan:
    """The part of a StepPlan the audit reads: one microbatch per bucket."""

    def __init__(self, step, buckets, dropped=()):
        self.step, self.num_buckets, self.dropped = step, len(buckets), list(dropped)
        self.stats = {"dropped_steps": [step, step]} if dropped else {}
        self.bins = [[FakePick(k) for k in keys] for keys in buckets]

    def bucket_bins(self, bucket):
        return [self.bins[bucket]]


def served(step, rank, keys):
    from flight_overlord.constructor.deliveries import keys_digest
    return {"t": 1.0 + step, "step": step, "rank": rank, "bucket": rank, "n": len(keys), "digest": keys_digest(keys)}


def test_a_step_some_rank_has_not_reached_is_not_yet_delivered_and_dropped_samples_are_skipped():
    plans = [Plan(0, [["web:a"], ["qa:b"]]), Plan(1, [["web:c"], ["qa:d"]], dropped=[("code:x", 0)]),
             Plan(2, [["web:e"], ["qa:f"]])]
    records = [served(0, 0, ["web:a"]), served(0, 1, ["qa:b"]), served(1, 0, ["web:c"]), served(1, 1, ["qa:d"]),
               served(2, 0, ["web:e"])]  # rank 1 has not read step 2 yet
    report = compute_audit([0.0], records, plans, [])
    assert (report["missing"], report["not_yet_delivered"], report["through_step"]) == (0, 1, 1)
    assert (report["skipped"], report["skipped_steps"], report["per_source"]["code"]["skipped"]) == (1, [1], 1)
    text = render(report)
    assert all(line.strip() for line in text.splitlines())
    assert "not yet delivered: 1 samples planned for steps 2-2" in text and "skipped on purpose" in text
    # only rank 0 ever read: bucket 1 holds the audit back instead of counting its steps missing
    report = compute_audit([0.0], [served(s, 0, [f"web:{k}"]) for s, k in enumerate("ace")], plans, [])
    assert (report["missing"], report["through_step"]) == (0, -1)
