"""One rank's raw Arrow tables, step by step (``StepFetcher``): a rank stream ticket from the Planner,
then one long-lived stream at the constructor (a ``do_exchange`` with credits, ``wire/credits.py``, or a
stock ``do_get``); one step alone is the stream's one-step slice. While it retries it says what it
waits for, where and since when
(``WaitLog``); a server's refusal arrives as one line (``wire.server.refusal``).
"""
from __future__ import annotations

import logging
import re
import time
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.flight as fl

from ..wire.credits import credit_message
from ..wire.security import Credentials
from ..wire.server import RETRY_SECONDS, ClientPool, ask_again, refusal
from ..wire.tickets import STREAM_KINDS

log = logging.getLogger("flight_overlord.client")
LOG_EVERY_SECONDS = 5.0  # a waiting client logs what it waits for at most this often
ADDRESS = re.compile(r"^grpc(\+tls|\+tcp)?://[^/:\s]+:\d+/?$")
REFUSALS = (fl.FlightServerError, fl.FlightUnauthenticatedError, fl.FlightUnauthorizedError)
STREAM_OF = {carries: kind for kind, carries in STREAM_KINDS.items()}  # "batch" -> "rank", "encoder" -> "encoder-rank"
_BROKEN = (fl.FlightUnavailableError, fl.FlightInternalError, fl.FlightCancelledError, fl.FlightTimedOutError)


def checked_address(address: str) -> str:
    """``address`` if it is a Planner address (``grpc://HOST:PORT``, ``grpc+tls://HOST:PORT``), else a
    ValueError naming it and the form expected."""
    if not isinstance(address, str) or not ADDRESS.match(address):
        raise ValueError(f"Planner address {address!r} is not of the form grpc://HOST:PORT (or grpc+tls://HOST:PORT "
                         f"with TLS), as `overlord up` prints it")
    return address


def _clock(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(seconds))


class WaitLog:
    """Logs a wait (what, where, since when) once it lasts, and then at most every ``LOG_EVERY_SECONDS``."""

    def __init__(self, rank: int, every: float = LOG_EVERY_SECONDS):
        self.rank, self.every = rank, every
        self._last = 0.0

    def waiting(self, what: str, where: str, since: float, why: str) -> None:
        now = time.time()
        if now - since >= self.every / 5 and now - self._last >= self.every:
            self._last = now
            log.warning("rank %d: waiting for %s from %s since %s (%.0f s): %s", self.rank, what, where,
                        _clock(since), now - since, why)


def _close_quietly(writer) -> None:
    """End a credit writer whose stream is over (else its destructor reports the cancelled call on stderr)."""
    if writer is not None:
        try:
            writer.close()
        except (fl.FlightError, pa.ArrowException, OSError):
            pass


def _batches(reader: fl.FlightStreamReader) -> Iterator[pa.RecordBatch]:
    while True:
        try:
            yield reader.read_chunk().data
        except StopIteration:
            return


class StepFetcher:
    """Fetches one rank's raw Arrow tables step by step over its rank stream (``stream``; ``fetch``: one
    step alone, the stream's one-step slice).

    ``token``: a trainer token (default ``$OVERLORD_TRAINER_TOKEN``), needed when the run's config
    names trainer tokens; ``credentials`` (``wire.security.Credentials``): token and TLS material at
    once (default: the token, and the CA / client certificate files of ``$OVERLORD_TLS_CA``,
    ``$OVERLORD_TLS_CERT``, ``$OVERLORD_TLS_KEY``). ``window``: the steps a rank stream may have in
    flight at its start (its credit, ``wire/credits.py``), None: a stock ``do_get`` (gRPC's window).
    A bad address is a ValueError here; a server's refusal raises its Flight error with one line."""

    def __init__(self, planner: str, rank: int, *, timeout: float = 300.0, token: str | None = None,
                 credentials: Credentials | None = None, window: int | None = None):
        self.planner_location = checked_address(planner)
        self.rank = rank
        self.timeout = timeout
        if credentials is None:
            credentials = Credentials.for_trainer(token)
        elif token is not None:
            credentials = credentials.with_token(token)
        self._pool = ClientPool(credentials)
        self._closed = False
        self._reader: fl.FlightStreamReader | None = None  # the rank stream being read, if any
        self._writer = None  # its credit writer (a rank stream with credits)
        self._window = window
        self._upto: int | None = None  # the credit given: steps before it may be sent
        self._log = WaitLog(rank)
        self.stream_location: str | None = None  # the constructor the rank stream reads from, once known

    @property
    def planner(self) -> fl.FlightClient:
        """A client of the Planner (for calls of your own: it carries the credentials)."""
        return self._pool.get(self.planner_location)

    def fetch(self, step: int, kind: str = "batch") -> pa.Table:
        """Step ``step`` alone: the rank stream's one-step slice (``kind`` "batch": the rank's
        microbatches; "encoder": the images its vision encoder processes, under an image graph)."""
        if kind not in STREAM_OF:
            raise ValueError(f"kind {kind!r}: a rank's step is fetched as 'batch' or 'encoder'")
        return [table for _, table in self.stream(step, step + 1, STREAM_OF[kind])][0]

    def stream(self, step: int, end: int | None = None, kind: str = "rank") -> Iterator[tuple[int, pa.Table]]:
        """(step, table) from ``step`` on (up to ``end``) over the rank stream (``kind`` "rank": its
        batches; "encoder-rank": the images its vision encoder processes): one ticket from the Planner,
        one long-lived stream at the constructor. When the stream breaks (the constructor died or
        moved) the Planner is asked again for where to resume, at the next step not yet received, so no
        step comes twice or is skipped; after ``timeout`` of failures the error names the constructor."""
        down_since = None
        while end is None or step < end:
            descriptor = fl.FlightDescriptor.for_path(kind, str(self.rank), str(step),
                                                      *([] if end is None else [str(end)]))
            info = self.retry(lambda client: client.get_flight_info(descriptor), self.planner_location,
                              f"rank ticket from step {step}", "the planner")
            endpoint = info.endpoints[0]
            location = endpoint.locations[0].uri.decode() if endpoint.locations else self.planner_location
            self.stream_location = location
            reader = None
            try:
                if self._closed:
                    raise RuntimeError(f"rank {self.rank}: the client is closed (no step {step})")
                reader = self._open(location, endpoint.ticket, step)
                for batch in _batches(reader):
                    down_since = None
                    got = batch.column("step")[0].as_py() if batch.num_rows else step
                    if got != step:
                        raise RuntimeError(f"rank {self.rank}: the rank stream sent step {got}, expected {step}")
                    yield step, pa.Table.from_batches([batch])
                    step += 1
                    if end is not None and step >= end:
                        return
                raise fl.FlightUnavailableError(f"the rank stream at {location} ended (the constructor is stopping)")
            except REFUSALS as exc:
                raise type(exc)(f"rank {self.rank}: the constructor at {location} refused the {kind} stream from "
                                f"step {step}: {refusal(exc)}") from None
            except _BROKEN as exc:
                down_since = down_since or time.time()
                self._pool.forget(location)
                if time.time() - down_since > self.timeout:
                    raise TimeoutError(f"rank {self.rank}: the {kind} stream from the constructor at {location} broke "
                                       f"at step {step} and has not come back since {_clock(down_since)}: "
                                       f"{refusal(exc)}") from None
                self._log.waiting(f"the {kind} stream from step {step}", f"the constructor at {location}",
                                  down_since, refusal(exc))
                time.sleep(RETRY_SECONDS)
            finally:
                writer, self._reader, self._writer = self._writer, None, None
                if reader is not None:
                    reader.cancel()
                _close_quietly(writer)

    def waiting(self, what: str, since: float) -> None:
        """The training loop has waited for ``what`` since ``since`` (epoch seconds): logged as any wait."""
        where = (f"the constructor at {self.stream_location}" if self.stream_location
                 else f"the planner at {self.planner_location}")
        self._log.waiting(what, where, since, "not received yet")

    def _open(self, location: str, ticket: fl.Ticket, step: int) -> fl.FlightStreamReader:
        """The rank stream at ``location``: with credits (``window``), a ``do_exchange`` given its credit
        at once; else a stock ``do_get``."""
        client = self._pool.get(location)
        if self._window is None:
            self._reader = client.do_get(ticket)
            return self._reader
        # the first stream: the window; a stream reopened: the credit given last still holds (the queue
        # may be full), and it is past ``step`` (each queued step's credit allows the next)
        self._upto = step + self._window if self._upto is None else max(self._upto, step + 1)
        writer, self._reader = client.do_exchange(fl.FlightDescriptor.for_command(ticket.ticket))
        writer.write_metadata(credit_message(self._upto))
        self._writer = writer
        return self._reader

    def credit(self, upto: int | None = None) -> None:
        """Let the rank stream send the steps before ``upto`` (None: say the last credit again, which a
        waiting client does every ``HEARTBEAT_SECONDS``). A broken stream shows at the next read."""
        if upto is not None:
            self._upto = max(self._upto or 0, upto)
        writer = self._writer
        if writer is None or self._upto is None:  # between streams: the next one opens with it
            return
        try:
            writer.write_metadata(credit_message(self._upto))
        except (fl.FlightError, pa.ArrowException, OSError):
            pass

    def retry(self, call: Callable[[fl.FlightClient], object], location: str, what: str, role: str):
        """``call(client)`` at ``location``. Server-side waits time out and are asked again
        (``ask_again``); an unreachable role (restarting) is polled every ``RETRY_SECONDS`` on a fresh
        connection; after ``timeout`` the error says which role is down, where, and since when. Both
        waits are logged (``WaitLog``); a refusal raises its Flight error, as one line."""
        deadline = time.monotonic() + self.timeout
        since, down_since = time.time(), None

        def attempt():
            self._log.waiting(what, f"{role} at {location}", since, "it has not answered yet (the run is behind)")
            return call(self._pool.get(location))
        while True:
            try:
                answer = ask_again(attempt, stop=lambda: self._closed, deadline=deadline)
            except fl.FlightTimedOutError:  # the server waited its share each time, till the deadline
                raise TimeoutError(f"rank {self.rank}: no {what} from {role} at {location} after "
                                   f"{self.timeout:.0f}s (since {_clock(since)})") from None
            except fl.FlightUnavailableError as exc:
                down_since = down_since or time.time()
                self._pool.forget(location)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {self.rank}: no {what}: {role} at {location} has been unreachable "
                                       f"since {_clock(down_since)}") from None
                self._log.waiting(what, f"{role} at {location}", down_since, f"unreachable ({refusal(exc)})")
                time.sleep(RETRY_SECONDS)
                continue
            except REFUSALS as exc:
                raise type(exc)(f"rank {self.rank}: {role} at {location} refused the {what}: {refusal(exc)}") from None
            if answer is None and self._closed:
                raise RuntimeError(f"rank {self.rank}: the client is closed (no {what})")
            return answer

    def close(self) -> None:
        self._closed = True
        reader = self._reader
        if reader is not None:  # a stream waiting for its next step ends now
            reader.cancel()
        self._pool.close()
