"""The read-ahead workers of one loader process, shared by the loader actors it hosts.

An actor reads a row group ahead of its demand when its buffer allows it (``LoaderActor.read_ahead_once``);
it need not hold a thread to wait for that moment. Each actor is *poked* whenever something that decides
it changes (a demand, a fetch, a release, a reshard, a journal followed), and a few worker threads take
the poked actors in turn, one row group at a time, so that 96 actors cost a few threads instead of 192
that all wait on their own condition and wake one another up for the GIL. An actor whose journal other
replicas write too (``loader.shadows``) is followed every ``FOLLOW_SECONDS`` by one ticker thread.
"""
from __future__ import annotations

import collections
import logging
import threading

log = logging.getLogger(__name__)
FOLLOW_SECONDS = 0.2  # how often a replica folds in what the others journaled
# Worker threads per loader process: a row group's read spends most of its time in Arrow's decode and
# decompression (GIL released), so two let one read while the other takes its turn at the GIL. Not tuned
# further: with two, the reads are not what a step waits for at 96 sources (docs/methods/node-cores.md).
WORKERS = 2


class ReadAheadPool:
    """Worker threads that run the poked actors' ``read_ahead_once`` in turn; an actor is queued at most
    once and worked on by one worker at a time (its read-ahead slot is its own)."""

    def __init__(self, workers: int = WORKERS):
        self._cond = threading.Condition()
        self._due: collections.deque = collections.deque()  # actors to work on, in the order poked
        self._queued: set[int] = set()  # ids of the actors in _due or being worked on
        self._again: set[int] = set()  # ids of the actors poked while being worked on
        self._followed: list = []  # the actors the ticker follows (replicated journals)
        self._stopping = False
        self._stopped = threading.Event()  # the ticker's (its own wait: a worker's notify must wake a worker)
        self._threads = [threading.Thread(target=self._work, name=f"read-ahead-{i}", daemon=True)
                         for i in range(max(1, workers))]
        self._threads.append(threading.Thread(target=self._tick, name="follow", daemon=True))
        for thread in self._threads:
            thread.start()

    def add(self, actor) -> None:
        """Start serving ``actor``: its first read-ahead now, its journal followed if replicated."""
        with self._cond:
            if actor.replicated:
                self._followed.append(actor)
        self.poke(actor)

    def remove(self, actor) -> None:
        with self._cond:
            self._followed = [a for a in self._followed if a is not actor]

    def poke(self, actor) -> None:
        """Something that decides ``actor``'s read-ahead changed: give it a turn (cheap, never blocks long)."""
        with self._cond:
            if id(actor) in self._queued:
                self._again.add(id(actor))  # being worked on (or queued): look once more after this turn
                return
            self._queued.add(id(actor))
            self._due.append(actor)
            self._cond.notify()

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._due)
                if self._stopping:
                    return
                actor = self._due.popleft()
                self._again.discard(id(actor))
            try:
                more = actor.read_ahead_once()
            except Exception:  # a read's own errors are the actor's (logged, skipped); this is a bug: keep serving
                log.exception("loader %s: read-ahead failed", actor.name)
                more = False
            with self._cond:
                if more or id(actor) in self._again:
                    self._again.discard(id(actor))
                    self._due.append(actor)  # behind the others: one row group per turn
                    self._cond.notify()
                else:
                    self._queued.discard(id(actor))

    def _tick(self) -> None:
        while not self._stopped.wait(FOLLOW_SECONDS):
            with self._cond:
                followed = list(self._followed)
            for actor in followed:
                actor.follow_now()

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._stopped.set()
