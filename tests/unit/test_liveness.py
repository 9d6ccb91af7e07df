"""Hangs as failures, the pure parts: the fence a replaced process is stopped by, the liveness config
section, deadlines turned into "did not answer", and the standby's lease against a real Flight server
that stops answering (SIGSTOP) and one that refuses."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pyarrow.flight as fl
import pytest

from flight_overlord.config import ConfigError, LivenessConfig, load_config
from flight_overlord.errors import Fenced
from flight_overlord.fence import FENCED_EXIT_STATUS, Fence, claim, loader_fence_name
from flight_overlord.planner.standby import ANSWERED, REFUSED, SILENT, _probe
from flight_overlord.wire.server import ClientPool, call_any, within

from ..helpers import write_config


def test_a_second_claim_fences_the_first_holder_and_only_it(tmp_path):
    first = claim(tmp_path, "constructor-0")
    first.check()  # its own claim, and a touch of the file that keeps its token, do not fence it
    os.utime(first.path)
    first.check()
    second = claim(tmp_path, "constructor-0")
    assert (first.generation, second.generation) == (1, 2)
    with pytest.raises(Fenced, match=r"constructor-0 of generation 1 .* replaced by generation 2"):
        first.check()
    second.check()
    claim(tmp_path, "constructor-1").check()  # another role's fence is another file
    second.check()
    assert Fence(tmp_path, "planner").holder() is None
    Fence(tmp_path, "never-claimed").check()  # an unclaimed fence (a role object used in-process) never fences


def test_a_fenced_process_exits_with_its_own_status_when_it_checks(tmp_path):
    """``enforce`` ends the process at once (no handler or journal write after it)."""
    code = ("import sys; from flight_overlord.fence import claim; f = claim(sys.argv[1], 'planner'); "
            "print('claimed', flush=True); sys.stdin.readline(); f.enforce(); print('served')")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "claimed"
    claim(tmp_path, "planner")  # the replacement
    out, _ = child.communicate("go\n", timeout=30)
    assert (child.returncode, out) == (FENCED_EXIT_STATUS, "")


def test_loader_fence_names_say_which_actors_and_replica_and_stay_short():
    assert loader_fence_name([("qa", 0), ("code", 1)], 0) == "loader-qa-0+code-1"
    assert loader_fence_name([("qa", 0)], 1) == "loader-qa-0-shadow1"
    many = loader_fence_name([(f"source_with_a_long_name_{i}", i) for i in range(40)], 2)
    assert len(many) < 64 and many.endswith("-shadow2")


def test_liveness_section_defaults_and_errors_name_the_key(corpus, tmp_path):
    assert load_config(write_config(tmp_path / "a", corpus)).liveness == LivenessConfig()
    cfg = load_config(write_config(tmp_path / "b", corpus, liveness={"hung_seconds": 0}))
    assert not cfg.liveness.watched
    for bad, message in [({"hung_seconds": -1}, "liveness.hung_seconds: must be >= 0"),
                         ({"probe_seconds": "fast"}, "liveness.probe_seconds: expected a number"),
                         ({"probe_seconds": 2, "hung_seconds": 1}, "must be >= liveness.probe_seconds"),
                         ({"lease": 3}, "unknown key 'liveness.lease'")]:
        with pytest.raises(ConfigError, match=message):
            load_config(write_config(tmp_path / "c", corpus, liveness=bad))


def test_within_turns_a_passed_deadline_into_unavailable_and_leaves_a_servers_own_timeout():
    def silent(options):
        time.sleep(options.timeout)
        raise fl.FlightTimedOutError("Deadline Exceeded")

    with pytest.raises(fl.FlightUnavailableError, match="no answer within the 0.05s deadline"):
        within(0.05, silent)

    def bounded_wait(options):
        raise fl.FlightTimedOutError("timed out after 1s waiting for step 3")
    with pytest.raises(fl.FlightTimedOutError, match="waiting for step 3"):
        within(30, bounded_wait)
    assert within(1, lambda options: options.timeout) == 1


_SERVER = ("import sys, pyarrow.flight as fl\n"
           "class S(fl.FlightServerBase):\n"
           "    def list_actions(self, context): return []\n"
           "s = S('grpc://127.0.0.1:0'); print(s.port, flush=True); s.serve()\n")


def _flight_process() -> tuple[subprocess.Popen, str]:
    """A process serving a trivial Flight server (a stand-in peer), and its location."""
    child = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    return child, f"grpc://127.0.0.1:{child.stdout.readline().strip()}"


def test_the_standbys_probe_tells_answered_silent_and_refused_apart(tmp_path):
    """A stopped process still accepts connections: only a deadline tells it from a live one."""
    child, location = _flight_process()
    try:
        assert _probe(location, None, timeout=5) == ANSWERED
        os.kill(child.pid, signal.SIGSTOP)
        # on a loaded host the first probe may still race the stop; a stopped process is silent from then on
        assert SILENT in [_probe(location, None, timeout=0.5) for _ in range(3)]
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        assert _probe(location, None, timeout=0.5) == REFUSED
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_call_past_its_deadline_at_a_hung_peer_goes_to_the_next_one_and_says_so(caplog):
    """What a constructor's loader fetch does when a loader hangs with no supervisor to kill it (``overlord
    serve``): the deadline passes, a warning names the peer and its address, the next replica answers."""
    (hung, stopped), (live, answering) = _flight_process(), _flight_process()
    pool = ClientPool()
    try:
        os.kill(hung.pid, signal.SIGSTOP)
        answer = call_any(pool, [stopped, answering], lambda c: within(0.5, lambda o: list(c.list_actions(o)) or "ok"),
                          what="the loader of qa", timeout=10)
    finally:
        pool.close()
        for child in (hung, live):
            child.kill()
            child.wait()
    assert answer == "ok"
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == [f"the loader of qa at {stopped}: no answer within the 0.5s deadline; trying the next replica"], said


def test_a_journal_writes_nothing_once_its_guard_refuses(tmp_path):
    """The Planner's journal checks its fence before every record: a replaced Planner appends none."""
    from flight_overlord.journal import Journal, read_journal
    fence = claim(tmp_path, "planner")
    journal = Journal(tmp_path / "plan-journal.jsonl", guard=fence.check)
    journal.append({"step": 0})
    claim(tmp_path, "planner")  # the standby took the lease over
    with pytest.raises(Fenced):
        journal.append({"step": 1})
    journal.close()
    assert [record for _, record in read_journal(tmp_path / "plan-journal.jsonl")] == [{"step": 0}]


def test_a_process_not_yet_heard_from_gets_more_than_one_lease():
    """A standby just promoted to Planner restores before it answers: it is not hung after one lease."""
    cfg = LivenessConfig(hung_seconds=1.0)
    assert cfg.silence_allowed(answered_once=True) == 1.0
    assert cfg.silence_allowed(answered_once=False) > 5 * cfg.silence_allowed(answered_once=True)
