"""Config section ``liveness``: how a hung role is told from a slow one, and the deadlines of internal calls.

A role is *alive* while it answers a trivial call (``list_actions``, served by the gRPC threads beside
its work) within ``hung_seconds``; it is asked every ``probe_seconds``. That question does not wait for
the role's work, so a process busy with honest slow work (a big row group read from object storage, a
long plan) still answers it in milliseconds: ``hung_seconds`` only has to exceed the pauses of a healthy
process (scheduling on a loaded host, a GC pause), not any work. A hung role is killed and replaced
(``deploy/liveness.py``); the standby Planner's lease on the Planner is the same ``hung_seconds``. A
false alarm costs a restart, never a stream: every role rebuilds its state from the journals.

Work itself has deadlines of its own, far above any honest work: ``fetch_seconds`` for one loader
fetch (a constructor's samples, the Planner's metadata: the read of a row group may be behind it),
``call_seconds`` for one internal control call (register, resume point). They end a call to a peer
that never answers when nothing kills it (a peer on another host without a supervisor).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .fields import as_number, check_keys, defaults_of

STARTING_LEASES = 10  # a process not yet heard from is hung only after this many leases of silence


@dataclass(frozen=True)
class LivenessConfig:
    probe_seconds: float = 0.2   # how often each role is asked whether it is alive
    hung_seconds: float = 1.0    # no answer for this long: hung (0: never declared hung)
    call_seconds: float = 30.0   # deadline of one internal control call
    fetch_seconds: float = 300.0  # deadline of one loader fetch (a big row group on object storage)

    @property
    def watched(self) -> bool:
        return self.hung_seconds > 0

    def silence_allowed(self, answered_once: bool) -> float:
        """Seconds of silence that make a process hung. One not yet heard from since it started (or since
        a standby took over) may be restoring its state from the journal, holding the GIL for long
        stretches on a loaded host: it gets ``STARTING_LEASES`` times the lease."""
        return self.hung_seconds * (1 if answered_once else STARTING_LEASES)

    @classmethod
    def parsed(cls, raw: Any) -> "LivenessConfig":
        """The section from YAML, each error naming its key."""
        values = check_keys(raw, "liveness", defaults_of(LivenessConfig))
        probe = as_number(values["probe_seconds"], "liveness.probe_seconds", minimum=0.01)
        hung = as_number(values["hung_seconds"], "liveness.hung_seconds", minimum=0.0)
        call = as_number(values["call_seconds"], "liveness.call_seconds", minimum=0.1)
        fetch = as_number(values["fetch_seconds"], "liveness.fetch_seconds", minimum=0.1)
        if 0 < hung < probe:
            raise ConfigError(f"liveness.hung_seconds ({hung:g}) must be >= liveness.probe_seconds ({probe:g}): "
                              f"a role is asked once per probe")
        return cls(probe, hung, call, fetch)
