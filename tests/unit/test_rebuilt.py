"""Steps built again for ranks that went back to them (constructor/rebuilt.py): once for every rank that
asks at once, a few kept, a failed build raised and built again on the next ask."""
from __future__ import annotations

import threading
import time

import pytest

from flight_overlord.constructor.rebuilt import RebuiltSteps


def test_a_step_built_again_is_built_once_for_every_rank_that_asks_and_few_are_kept():
    built, gate = [], threading.Event()

    def build(step):
        built.append(step)
        gate.wait(5)
        return {"step": step}
    steps = RebuiltSteps(build, keep=2)
    got = []
    ranks = [threading.Thread(target=lambda: got.append(steps.tables(4))) for _ in range(3)]
    for t in ranks:
        t.start()
    while not built:
        time.sleep(0.01)
    gate.set()
    for t in ranks:
        t.join(5)
    assert built == [4] and got == [{"step": 4}] * 3
    steps.tables(5), steps.tables(6)
    assert steps.steps() == [5, 6]


def test_a_failed_build_is_raised_and_built_again_on_the_next_ask():
    answers = iter([RuntimeError("loader down"), {"ok": True}])

    def build(step):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer
    steps = RebuiltSteps(build, keep=2)
    with pytest.raises(RuntimeError, match="loader down"):
        steps.tables(1)
    assert steps.tables(1) == {"ok": True}
