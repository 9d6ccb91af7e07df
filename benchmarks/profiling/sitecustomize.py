"""A stack-sampling profiler for one role process of a benchmark's cluster (py-spy without py-spy).

Python imports ``sitecustomize`` at start-up from ``sys.path``; a benchmark puts this directory on
``PYTHONPATH`` and sets ``OVERLORD_BENCH_PROFILE=ROLE:PATH``. In the process whose command line names
ROLE (``serve planner``), a daemon thread then samples every thread's Python stack every few
milliseconds (``sys._current_frames``) and rewrites PATH every two seconds with the functions seen
most (self and cumulative), leaving out threads parked in a wait and (for threads Python started)
threads that did not run on a CPU since the last sample (blocked in an fsync or a remote call).
Threads gRPC started count whenever they are in Python and not parked. Read it as where the
process spends its CPU, roughly; the per-thread CPU at its top is exact. Every other process ignores it.
"""
from __future__ import annotations

import collections
import functools
import os
import sys
import threading
import time

INTERVAL = 0.005
# A thread whose innermost frame is one of these is parked (waiting), not working.
IDLE = {("threading.py", "wait"), ("threading.py", "_wait_for_tstate_lock"), ("threading.py", "wait_for"),
        ("selectors.py", "select"), ("socket.py", "accept"), ("server.py", "serve"), ("queue.py", "get"),
        ("standby.py", "_probe")}


def _site(frame) -> tuple[str, str]:
    return os.path.basename(frame.f_code.co_filename), frame.f_code.co_name


def _label(frame) -> str:
    code = frame.f_code
    path = code.co_filename
    short = path.split("flight_overlord/", 1)[-1] if "flight_overlord/" in path else os.path.basename(path)
    return f"{short}:{code.co_firstlineno}:{code.co_name}"


def _on_cpu_ns(native_id: int) -> int | None:
    """Nanoseconds thread ``native_id`` has run on a CPU (/proc schedstat), None if unknown."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as stat:
            return int(stat.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _sample(own: int, self_counts, cum_counts, last_cpu: dict) -> int:
    """One sample of every thread not parked: a Python thread that has run on a CPU for under a
    tenth of the interval since the last sample is blocked in C (an fsync, a remote call) and left out."""
    busy = 0
    natives = {t.ident: t.native_id for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        if ident == own or _site(frame) in IDLE:
            continue
        native = natives.get(ident)
        if native is not None:
            now, before = _on_cpu_ns(native), last_cpu.get(native)
            last_cpu[native] = now
            if now is None or before is None or now - before < INTERVAL * 1e8:
                continue
        busy += 1
        self_counts[_label(frame)] += 1
        seen = set()
        while frame is not None:
            label = _label(frame)
            if label not in seen:
                seen.add(label)
                cum_counts[label] += 1
            frame = frame.f_back
    return busy


def _thread_cpu() -> list[str]:
    """CPU seconds of every thread of this process (/proc), named as Python knows it where it can."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    rows = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                text = stat.read()
        except OSError:
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        rows.append((cpu, f"{cpu:8.2f} s  {names.get(int(tid), comm)}"))
    return [row for _, row in sorted(rows, reverse=True)]


# Functions whose own thread's CPU is added up per call (inclusive of what they call): "module:attr.attr".
TIMED = ["flight_overlord.planner.planner:Planner._plan_next", "flight_overlord.planner.calls:call_any",
         "flight_overlord.journal:Journal.append", "flight_overlord.planner.planner:Planner._snapshot",
         "flight_overlord.planner.server:PlannerServer.action_plan",
         "flight_overlord.planner.service:constructor_plans",
         "flight_overlord.wire.plan:ConstructorPlan.to_wire", "flight_overlord.planner.planner:plan_step",
         "flight_overlord.wire.server:encode", "flight_overlord.wire.server:decode",
         "flight_overlord.planner.step_plan:StepPlan.to_record",
         "flight_overlord.planner.server:PlannerServer.get_flight_info",
         "flight_overlord.planner.program:_draw", "flight_overlord.planner.program:place",
         "flight_overlord.planner.program:_stats", "flight_overlord.core.mixing:MixerRun.fill",
         "flight_overlord.planner.program:drawn_table", "flight_overlord.planner.planner:step_record",
         "flight_overlord.planner.planner:Planner._planning_state",
         "flight_overlord.planner.constructor_plans:constructor_plans",
         "flight_overlord.wire.plan_channel:_message", "flight_overlord.wire.plan_channel:encode",
         "flight_overlord.planner.service:PlanService.constructor_plan",
         "flight_overlord.planner.service:PlanService.constructor_positions"]
_timed: dict[str, list] = {}  # name -> [calls, thread CPU seconds]


_collections: dict[int, list] = {}  # generation -> [collections, thread CPU seconds]
_collecting: dict[int, float] = {}  # thread -> when its collection started (thread CPU)


def _on_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _collecting[threading.get_ident()] = time.thread_time()
    elif threading.get_ident() in _collecting:
        totals = _collections.setdefault(info["generation"], [0, 0.0])
        totals[0] += 1
        totals[1] += time.thread_time() - _collecting.pop(threading.get_ident())


def _timing(name: str, fn):
    totals = _timed.setdefault(name, [0, 0.0])

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[0] += 1
            totals[1] += time.thread_time() - start
    return timed


def _patch_timed(pending: list[str]) -> list[str]:
    """Wrap the TIMED functions whose modules are imported by now; the rest stay pending."""
    left = []
    for spec in pending:
        module_name, _, attr = spec.partition(":")
        module = sys.modules.get(module_name)
        if module is None:
            left.append(spec)
            continue
        owner, *path = [module] + attr.split(".")[:-1], attr.split(".")[-1]
        holder = owner[-1] if len(owner) == 1 else getattr(owner[0], owner[1])
        setattr(holder, path[0], _timing(spec.split(":")[1], getattr(holder, path[0])))
    return left


def _write(path: str, samples: int, busy: int, self_counts, cum_counts) -> None:
    lines = ["thread CPU:", *_thread_cpu(), "", "timed (calls, thread CPU s, us per call):"]
    lines += [f"{n:8d} {cpu:8.3f} s {1e6 * cpu / max(n, 1):9.0f} us  {name}" for name, (n, cpu) in _timed.items()]
    lines += ["", "garbage collections (count, thread CPU s) by generation: "
              + ", ".join(f"gen{g} {n} {cpu:.3f} s" for g, (n, cpu) in sorted(_collections.items())), ""]
    lines += [f"samples {samples} (every {INTERVAL * 1e3:.0f} ms), busy thread-samples {busy}", "", "self:"]
    lines += [f"{n:8d} {100 * n / max(busy, 1):5.1f}%  {label}" for label, n in self_counts.most_common(40)]
    lines += ["", "cumulative:"]
    lines += [f"{n:8d} {100 * n / max(busy, 1):5.1f}%  {label}" for label, n in cum_counts.most_common(60)]
    with open(path + ".tmp", "w") as out:
        out.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)


def _run(path: str) -> None:
    own = threading.get_ident()
    self_counts, cum_counts = collections.Counter(), collections.Counter()
    samples = busy = 0
    last_cpu: dict[int, int] = {}
    last = time.monotonic()
    pending = list(TIMED)
    while True:
        time.sleep(INTERVAL)
        if pending and any(t.name == "planning" for t in threading.enumerate()):  # imports done
            pending = _patch_timed(pending)
        busy += _sample(own, self_counts, cum_counts, last_cpu)
        samples += 1
        if time.monotonic() - last > 2.0:
            _write(path, samples, busy, self_counts, cum_counts)
            last = time.monotonic()


def _start() -> None:
    spec = os.environ.get("OVERLORD_BENCH_PROFILE", "")
    role, _, path = spec.partition(":")
    if role:  # any role process: `kill -USR1 PID` prints its threads' stacks to its log
        import faulthandler
        import signal
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    if role and path and role in sys.argv[1:] and "serve" in sys.argv[1:]:
        import gc
        gc.callbacks.append(_on_gc)
        threading.Thread(target=_run, args=(f"{path}.{os.getpid()}",), name="bench-profiler", daemon=True).start()


_start()
