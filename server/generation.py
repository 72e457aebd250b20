"""Running one admitted request: the engine event pump, SSE streaming with keep-alives, the
non-streaming collector, and cancellation on every way out.

The engine stream is pulled by its own task into a queue, so a keep-alive timeout never cancels
the engine stream, and a disconnect, the drain deadline or an error can be delivered into the same
queue. Whatever ends a request, `Job.close` runs once: it cancels the engine request unless it
finished, stops the pump and records the outcome.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from engine.api import EngineError, Finished, GenerationRequest, TokenEvent
from server import errors, metrics, sse
from server.drain import ShuttingDown
from server.errors import APIError
from server.runtime import EngineLike, Runtime

log = logging.getLogger(__name__)

_END = object()


class ClientGone(Exception):
    """The client disconnected before the reply was complete."""


class Formatter(Protocol):
    """Builds the OpenAI objects of one request (see server.convert)."""

    def opening(self) -> list[dict[str, Any]]: ...

    def delta(self, event: TokenEvent) -> list[dict[str, Any]]: ...

    def closing(self, finished: Finished) -> list[dict[str, Any]]: ...

    def response(self, events: list[TokenEvent], finished: Finished) -> dict[str, Any]: ...


class Job:
    """One admitted request: its engine handle, event pump, metrics and cleanup."""

    def __init__(self, runtime: Runtime, engine: EngineLike, handle: Any, request: GenerationRequest,
                 endpoint: str) -> None:
        self.handle = handle
        self._engine = engine
        self._drain = runtime.drain
        self._num_prompt_tokens = len(request.prompt_ids)
        self._recorder = runtime.metrics.start(endpoint)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._finished = False
        self._closed = False
        self._drain.track(self)
        self._pump = asyncio.ensure_future(self._run_pump())

    async def _run_pump(self) -> None:
        try:
            async for event in self._engine.stream(self.handle):
                self._queue.put_nowait(event)
            self._queue.put_nowait(_END)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # engine errors and bugs alike end this request, not the server
            self._queue.put_nowait(exc)

    def interrupt(self, exc: Exception) -> None:
        """Make the consumer's next `next()` raise `exc` (disconnect, drain deadline)."""
        self._queue.put_nowait(exc)

    async def next(self, timeout: float | None) -> TokenEvent | Finished | None:
        """The next engine event, None after `timeout` seconds; raises what ended the request."""
        try:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            return None
        if isinstance(item, Exception):
            raise item
        if item is _END:
            raise EngineError("the engine stream ended without a terminal event")
        if isinstance(item, TokenEvent):
            self._recorder.tokens(len(item.token_ids), self._num_prompt_tokens)
            return item
        assert isinstance(item, Finished), item
        self._finished = True
        self._recorder.finished(item)
        return item

    def status_text(self) -> str:
        """Keep-alive comment text: the queue position while waiting."""
        try:
            position = int(self.handle.queue_position)
        except Exception:  # a handle without a position is simply not queued
            position = 0
        return f"queued position={position}" if position > 0 else "keep-alive"

    def close(self, outcome: str) -> None:
        """End the request once: cancel it in the engine unless finished, record the outcome."""
        if self._closed:
            return
        self._closed = True
        if not self._finished:
            self._engine.cancel(self.handle)
        self._pump.cancel()
        self._recorder.close(outcome)
        self._drain.untrack(self)


def start(runtime: Runtime, engine: EngineLike, request: GenerationRequest, endpoint: str) -> Job:
    """Submit to the engine (raising 400/429/503 before any response starts) and start the pump."""
    handle = runtime.submit(engine, request)
    return Job(runtime, engine, handle, request, endpoint)


async def respond(runtime: Runtime, job: Job, fmt: Formatter, request: Request, stream: bool,
                  headers: dict[str, str] | None = None) -> Response:
    """The reply to an admitted request: an SSE stream, or JSON once the engine finished."""
    if stream:
        frames = stream_frames(job, fmt, runtime.settings.keepalive_s)
        return sse.SSEResponse(frames, headers={**sse.HEADERS, **(headers or {})},
                               on_close=lambda: job.close(metrics.CANCELLED))
    events, finished = await collect(job, request)
    return JSONResponse(fmt.response(events, finished), headers=headers)


async def stream_frames(job: Job, fmt: Formatter, keepalive_s: float) -> AsyncIterator[str]:
    """SSE frames: opening chunks, deltas, closing chunks and [DONE]; keep-alives when idle."""
    outcome = metrics.CANCELLED
    try:
        for chunk in fmt.opening():
            yield sse.data(chunk)
        last_write = time.monotonic()
        while True:
            event = await job.next(max(last_write + keepalive_s - time.monotonic(), 0.0))
            if event is None:
                yield sse.comment(job.status_text())
            elif isinstance(event, TokenEvent):
                chunks = fmt.delta(event)
                if not chunks:
                    continue
                for chunk in chunks:
                    yield sse.data(chunk)
            else:
                for chunk in fmt.closing(event):
                    yield sse.data(chunk)
                yield sse.DONE
                outcome = metrics.OK
                return
            last_write = time.monotonic()
    except Exception as exc:  # after the headers went out an error is one event, then close
        error, outcome = _late_error(exc)
        yield sse.data(error.body())
    finally:
        job.close(outcome)


async def collect(job: Job, request: Request) -> tuple[list[TokenEvent], Finished]:
    """The whole completion; a client disconnect meanwhile cancels the engine request."""
    watcher = asyncio.ensure_future(_watch_disconnect(request, job))
    outcome = metrics.CANCELLED
    try:
        events: list[TokenEvent] = []
        while True:
            event = await job.next(None)
            assert event is not None  # no timeout given
            if isinstance(event, Finished):
                outcome = metrics.OK
                return events, event
            events.append(event)
    except ClientGone:
        gone = APIError(499, "Client closed the request.", code="client_closed_request")
        gone.counted = True
        raise gone from None
    except Exception as exc:
        error, outcome = _late_error(exc)
        error.counted = True
        raise error from exc
    finally:
        watcher.cancel()
        job.close(outcome)


async def _watch_disconnect(request: Request, job: Job) -> None:
    """Wait for `http.disconnect` (the body is already read) and interrupt the job."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.interrupt(ClientGone())
            return
        await asyncio.sleep(0.05)  # a server that returns other messages must not make us spin


def _late_error(exc: Exception) -> tuple[APIError, str]:
    """The error for a request that failed after admission, and its outcome label."""
    if isinstance(exc, ShuttingDown):
        return APIError(503, str(exc), code="server_shutting_down"), metrics.INTERRUPTED
    if isinstance(exc, APIError):
        return exc, metrics.outcome_for_status(exc.status)
    if not isinstance(exc, EngineError):
        log.error("request failed unexpectedly", exc_info=exc)
        exc = EngineError(repr(exc))
    error = errors.from_engine_error(exc)
    return error, metrics.outcome_for_status(error.status)
