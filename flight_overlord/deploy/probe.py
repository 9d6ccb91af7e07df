"""``overlord probe ADDRESS``: a liveness probe for an orchestrator (a Kubernetes exec probe, a Slurm
loop) where no supervisor of ours watches the roles (``overlord serve``). It asks what the supervisor
asks (``wire.server.probe``: a trivial call the server's own threads answer beside any work)."""
from __future__ import annotations

from ..client.fetcher import checked_address
from ..wire.security import Credentials
from ..wire.server import ANSWERED, REFUSED, connect, probe


def liveness(address: str, timeout: float, credentials: Credentials | None = None) -> tuple[bool, str]:
    """(whether the role at ``address`` answered within ``timeout`` seconds, one line saying so). Any answer
    counts, a refusal too; else the line says whether nothing listens (down) or a server took the call and
    let the deadline pass (hung). A malformed address is a ValueError naming it."""
    client = connect(checked_address(address), credentials)
    try:
        state = probe(client, timeout)
    finally:
        client.close()
    if state == REFUSED:
        return False, f"down: {address}: nothing answers there (not listening)"
    if state != ANSWERED:
        return False, f"hung: {address}: no answer within {timeout:g} s"
    return True, f"up: {address}"
