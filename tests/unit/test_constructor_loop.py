"""The constructor's assembly loop (constructor/loop.py) against in-memory plan and sample sources: no
process, no Flight. It assembles step after step from the resume point, paces on its rank streams'
positions (reporting them while it waits), hands a failing source's error to every waiting take, and
builds a released step again from the plan source."""
from __future__ import annotations

import threading
import time

import pytest

from flight_overlord.constructor.constructor import Constructor
from flight_overlord.errors import BackgroundFailure
from flight_overlord.harness import step_digest
from flight_overlord.planner.strategy import load_strategy

from .constructor_data import answer_of, make_cfg, plan

WAIT = 10.0  # bound on every wait of these tests (the loop's steps take milliseconds)


class FakePlans:
    """The Planner: step ``s``'s constructor plan is ``plan(s)``, handed out with the next step's (as the Planner
    answers); it stops at ``last``."""
    report_seconds = 0.01

    def __init__(self, start: int = 0, last: int = 100):
        self.start, self.last = start, last
        self.asked: list[int] = []       # steps asked for with plans_from
        self.reports: list[dict] = []    # positions reported while assembly waited
        self.again: list[int] = []       # steps asked for again (released, rebuilt)
        self.lock = threading.Lock()

    def resume_point(self):
        return self.start

    def plans_from(self, step, positions):
        with self.lock:
            self.asked.append(step)
            positions()
        return None if step >= self.last else [plan(s) for s in (step, step + 1) if s < self.last]

    def report(self, positions):
        with self.lock:
            self.reports.append(positions())
        return True

    def plan_again(self, step):
        self.again.append(step)
        return plan(step)


class FakeSamples:
    """The loaders: each call answers its groups' samples; ``fail_at`` a step whose call raises once
    ``fail`` is set (a failure fails every take after it, so a test lets it happen when it is ready)."""

    def __init__(self, fail_at: int | None = None):
        self.fail_at = fail_at
        self.fail = threading.Event()
        self.calls: list[int] = []

    def samples(self, step, groups):
        self.calls.append(step)
        if step == self.fail_at:
            self.fail.wait(WAIT)
            raise ConnectionError(f"loader down at step {step}")
        return answer_of(plan(step), groups), {"a": 0.001}


@pytest.fixture
def cfg(tmp_path):
    return make_cfg(tmp_path)


def running(cfg, plans: FakePlans, samples: FakeSamples) -> Constructor:
    constructor = Constructor(cfg, 0, load_strategy(cfg), plans=plans, samples=samples)
    threading.Thread(target=constructor.run, daemon=True).start()
    return constructor


def eventually(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def stream_of(constructor: Constructor, first: int, end: int | None = None):
    schema, steps = constructor.rank_stream(0, first, end)
    return steps


def test_it_assembles_step_after_step_from_the_resume_point(cfg):
    plans, samples = FakePlans(start=3, last=6), FakeSamples()
    constructor = running(cfg, plans, samples)
    try:
        got = [batch.column("step")[0].as_py() for batch in stream_of(constructor, 3, 6)]
        assert got == [3, 4, 5]
        assert plans.asked[:2] == [3, 5]  # step 4's plan came with step 3's answer
        assert sorted(set(samples.calls)) == [3, 4, 5] and samples.calls.count(3) == 2  # one call per loader process
        eventually(lambda: plans.asked[-1] >= plans.last, "the loop asks on until its plan source stops")
        assert constructor.status().bytes_fetched > 0
    finally:
        constructor.stop()


def test_it_paces_on_the_streams_positions_and_reports_them_while_it_waits(cfg):
    plans, samples = FakePlans(), FakeSamples()
    constructor = running(cfg, plans, samples)
    try:
        steps = stream_of(constructor, 0)
        next(steps)  # the stream sent step 0 and waits at step 1
        next(steps)
        paced = 1 + cfg.prefetch + 1  # steps up to the position + prefetch are assembled, no further
        eventually(lambda: constructor.staging.next_step == paced, "the loop assembles up to the pace")
        eventually(lambda: plans.reports and plans.reports[-1] == {"0": 1}, "a waiting loop reports the positions")
        assert constructor.staging.next_step == paced
        next(steps)  # the stream moves on: one more step is assembled
        eventually(lambda: constructor.staging.next_step == paced + 1, "the loop goes on when the stream moves")
        eventually(lambda: plans.reports[-1] == {"0": 2}, "the loop waits again, reporting the new position")
        assert constructor.staging.next_step == paced + 1
    finally:
        constructor.stop()


def test_a_failing_sample_source_reaches_every_waiting_take(cfg):
    plans, samples = FakePlans(), FakeSamples(fail_at=1)
    constructor = running(cfg, plans, samples)
    try:
        steps = stream_of(constructor, 0)  # step 0 is taken (the schema comes with it) ...
        samples.fail.set()  # ... before step 1's fetch fails
        next(steps)
        with pytest.raises(BackgroundFailure, match="constructor 0: assembly failed: ConnectionError: loader down"):
            next(steps)
        with pytest.raises(BackgroundFailure, match="loader down at step 1"):
            constructor.take("batch", 1, 0)
        assert constructor.status().error.startswith("constructor 0: assembly failed")
    finally:
        constructor.stop()


def test_a_released_step_is_built_again_from_the_plan_source(cfg):
    plans, samples = FakePlans(), FakeSamples()
    constructor = running(cfg, plans, samples)
    try:
        keep = constructor.staging.keep
        steps = stream_of(constructor, 0)
        first = [step_digest(_table(next(steps))) for _ in range(keep + 2)]
        eventually(lambda: 0 not in constructor.status().staged_steps, "step 0 is released")
        again = constructor.take("batch", 0, 0)
        assert plans.again == [0] and step_digest(again) == first[0]
    finally:
        constructor.stop()


def test_a_stopping_plan_source_ends_the_loop_quietly(cfg):
    plans = FakePlans(last=0)
    constructor = Constructor(cfg, 0, load_strategy(cfg), plans=plans, samples=FakeSamples())
    runner = threading.Thread(target=constructor.run, daemon=True)
    runner.start()
    runner.join(WAIT)
    assert not runner.is_alive() and constructor.status().error is None and plans.asked == [0]


def _table(batch):
    import pyarrow as pa
    return pa.Table.from_batches([batch])
