"""Running one admitted request: SSE streaming with keep-alives, the non-streaming collector, and
cancellation on every way out.

The request reads its events straight from the engine's per-request queue (`engine.next_event`,
with a timeout for keep-alives); a disconnect or the drain deadline is put into that same queue
(`engine.interrupt`). Whatever ends a request, `ActiveRequest.close` runs once: it cancels the
engine request unless it finished and records the outcome.
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
from server.runtime import AppState, EngineLike

log = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client disconnected before the reply was complete."""


class Formatter(Protocol):
    """Builds the API objects of one request (see server.convert), framed by `framing`."""

    framing: sse.Framing

    def opening(self) -> list[dict[str, Any]]: ...

    def delta(self, event: TokenEvent) -> list[dict[str, Any]]: ...

    def closing(self, finished: Finished) -> list[dict[str, Any]]: ...

    def response(self, events: list[TokenEvent], finished: Finished) -> dict[str, Any]: ...

    def error_body(self, error: APIError) -> dict[str, Any]: ...


class ActiveRequest:
    """One admitted request: its engine handle, metrics and cleanup."""

    def __init__(self, app_state: AppState, engine: EngineLike, handle: Any, request: GenerationRequest,
                 endpoint: str) -> None:
        self.handle = handle
        self._engine = engine
        self._drain = app_state.drain
        self._num_prompt_tokens = len(request.prompt_ids)
        self._recorder = app_state.metrics.start(endpoint)
        self._finished = False
        self._closed = False
        self._drain.track(self)

    def interrupt(self, exc: Exception) -> None:
        """Make the consumer's next `next()` raise `exc` (disconnect, drain deadline)."""
        self._engine.interrupt(self.handle, exc)

    async def next(self, timeout: float | None) -> TokenEvent | Finished | None:
        """The next engine event, None after `timeout` seconds; raises what ended the request."""
        event = await self._engine.next_event(self.handle, timeout)
        if event is None:
            return None
        if isinstance(event, TokenEvent):
            self._recorder.tokens(len(event.token_ids), self._num_prompt_tokens)
            return event
        assert isinstance(event, Finished), event
        self._finished = True
        self._recorder.finished(event)
        return event

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
        self._recorder.close(outcome)
        self._drain.untrack(self)


def start(app_state: AppState, engine: EngineLike, request: GenerationRequest, endpoint: str) -> ActiveRequest:
    """Submit to the engine (raising 400/429/503 before any response starts) and track the request."""
    handle = app_state.submit(engine, request)
    return ActiveRequest(app_state, engine, handle, request, endpoint)


async def respond(app_state: AppState, active: ActiveRequest, fmt: Formatter, request: Request, stream: bool,
                  headers: dict[str, str] | None = None) -> Response:
    """The reply to an admitted request: an SSE stream, or JSON once the engine finished."""
    if stream:
        frames = stream_frames(active, fmt, app_state.settings.keepalive_s)
        return sse.SSEResponse(frames, headers={**sse.HEADERS, **(headers or {})},
                               on_close=lambda: active.close(metrics.CANCELLED))
    try:
        events, finished = await collect(active, request)
    except APIError as error:  # answered here, not by the app's handler: the recorder already counted it
        return error.response()
    return JSONResponse(fmt.response(events, finished), headers=headers)


async def stream_frames(active: ActiveRequest, fmt: Formatter, keepalive_s: float) -> AsyncIterator[str]:
    """SSE frames: opening chunks, deltas, closing chunks and [DONE]; keep-alives when idle."""
    outcome = metrics.CANCELLED
    frame = fmt.framing.event
    try:
        for chunk in fmt.opening():
            yield frame(chunk)
        last_write = time.monotonic()
        while True:
            event = await active.next(max(last_write + keepalive_s - time.monotonic(), 0.0))
            if event is None:
                yield sse.comment(active.status_text())
            elif isinstance(event, TokenEvent):
                chunks = fmt.delta(event)
                if not chunks:
                    continue
                for chunk in chunks:
                    yield frame(chunk)
            else:
                for chunk in fmt.closing(event):
                    yield frame(chunk)
                if fmt.framing.end is not None:
                    yield fmt.framing.end
                outcome = metrics.OK
                return
            last_write = time.monotonic()
    except Exception as exc:  # after the headers went out an error is one event, then close
        error, outcome = _late_error(exc)
        yield frame(fmt.error_body(error))
    finally:
        active.close(outcome)


async def collect(active: ActiveRequest, request: Request) -> tuple[list[TokenEvent], Finished]:
    """The whole completion; a client disconnect meanwhile cancels the engine request."""
    watcher = asyncio.ensure_future(_watch_disconnect(request, active))
    outcome = metrics.CANCELLED
    try:
        events: list[TokenEvent] = []
        while True:
            event = await active.next(None)
            assert event is not None  # no timeout given
            if isinstance(event, Finished):
                outcome = metrics.OK
                return events, event
            events.append(event)
    except ClientGone:
        raise APIError(499, "Client closed the request.", code="client_closed_request") from None
    except Exception as exc:
        error, outcome = _late_error(exc)
        raise error from exc
    finally:
        watcher.cancel()
        active.close(outcome)


async def _watch_disconnect(request: Request, active: ActiveRequest) -> None:
    """Wait for `http.disconnect` (the body is already read) and interrupt the request."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            active.interrupt(ClientGone())
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
