"""Graceful shutdown: on SIGTERM new requests get 503 and in-flight ones get a grace period.

A request still running when the grace period ends is interrupted: its stream ends with one
error event (code `server_shutting_down`), a non-streaming request gets a 503.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

log = logging.getLogger(__name__)


class Interruptible(Protocol):
    """What the drain can stop: an in-flight request."""

    def interrupt(self, exc: Exception) -> None: ...


class ShuttingDown(Exception):
    """The grace period ended before the request finished."""


class Drain:
    """Tracks in-flight requests and, once draining, their deadline."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.draining = False
        self._jobs: set[Interruptible] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Remember the event loop the requests run on (set at startup or by the first request)."""
        self._loop = loop

    def track(self, job: Interruptible) -> None:
        """An admitted request starts; call on the event loop."""
        if self._loop is None:
            self.bind(asyncio.get_running_loop())
        self._jobs.add(job)

    def untrack(self, job: Interruptible) -> None:
        """The request ended."""
        self._jobs.discard(job)

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet ended."""
        return len(self._jobs)

    def begin(self) -> None:
        """Start draining; safe to call from a signal handler or another thread."""
        if self.draining:
            return
        self.draining = True
        log.info("draining: %d request(s) in flight, grace %.1f s", len(self._jobs), self.grace_s)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._arm)

    def _arm(self) -> None:
        assert self._loop is not None
        self._timer = self._loop.call_later(self.grace_s, self._expire)

    def _expire(self) -> None:
        for job in list(self._jobs):
            job.interrupt(ShuttingDown("The server is shutting down; the request was stopped."))
