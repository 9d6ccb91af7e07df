"""A logic class's bounded wait raises no Flight error (the server base maps it), each server's
waiters are its own, and a client asks again on a server-side time-out until its deadline or its stop."""
from __future__ import annotations

import threading
import time

import pyarrow.flight as fl
import pytest

from flight_overlord.errors import Busy, OverlordError, WaitTimedOut
from flight_overlord.waiting import Waiters
from flight_overlord.wire.server import ask_again, client_error


def test_a_wait_that_runs_out_is_a_plain_error_the_server_base_answers_as_a_time_out():
    cond = threading.Condition()
    with cond, pytest.raises(WaitTimedOut, match="timed out after 0s waiting for step 3") as caught:
        Waiters().wait_until(cond, lambda: False, 0.01, "step 3")
    assert isinstance(caught.value, OverlordError) and isinstance(caught.value, TimeoutError)
    assert not isinstance(caught.value, fl.FlightError)
    answered = client_error(caught.value, "Test.do_get")
    assert isinstance(answered, fl.FlightTimedOutError) and "waiting for step 3" in str(answered)
    assert isinstance(client_error(Busy("busy: 512 calls"), "Test.do_get"), fl.FlightServerError)
    with cond:
        Waiters().wait_until(cond, lambda: True, 0.01, "nothing")  # already true: no wait


def test_each_server_s_waiters_are_its_own_so_a_full_one_refuses_only_its_own_calls():
    planner, constructor = Waiters(limit=1), Waiters(limit=1)  # two roles of one process
    cond, holding, release, checks = threading.Condition(), threading.Event(), threading.Event(), []

    def released() -> bool:  # checked once before the wait takes its place, then inside it
        if checks:
            holding.set()
        checks.append(1)
        return release.is_set()

    def wait() -> None:
        with cond:
            planner.wait_until(cond, released, 10, "the test")
    waiting = threading.Thread(target=wait, daemon=True)
    waiting.start()
    try:
        assert holding.wait(10)
        with cond, pytest.raises(Busy, match=r"busy: 1 calls are already waiting on this server \(for step 9\)"):
            planner.wait_until(cond, lambda: False, 0.01, "step 9")
        with cond, pytest.raises(WaitTimedOut):  # the other server's place is free: it waits, and runs out
            constructor.wait_until(cond, lambda: False, 0.01, "step 9")
    finally:
        release.set()
        with cond:
            cond.notify_all()
        waiting.join(10)
    with cond, pytest.raises(WaitTimedOut):  # the place is given back when the wait ends
        planner.wait_until(cond, lambda: False, 0.01, "step 9")


def test_ask_again_rides_out_time_outs_until_an_answer_a_deadline_or_a_stop():
    answers = iter([fl.FlightTimedOutError("wait"), fl.FlightTimedOutError("wait"), "planned"])

    def ask():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer
    assert ask_again(ask) == "planned"

    def never():
        raise fl.FlightTimedOutError("still planning")
    with pytest.raises(fl.FlightTimedOutError, match="still planning"):
        ask_again(never, deadline=time.monotonic() + 0.05)
    assert ask_again(never, stop=iter([False, False, True]).__next__) is None
    with pytest.raises(fl.FlightUnavailableError):  # not a time-out: the caller's to handle
        ask_again(lambda: (_ for _ in ()).throw(fl.FlightUnavailableError("down")))
