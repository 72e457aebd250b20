"""Server-sent events framing, and a response that stops on client disconnect.

Chat and text completions frame as OpenAI does (`DATA_ONLY`): `data: {json}\\n\\n` per chunk,
`data: [DONE]\\n\\n` at the end, `data: {"error": ...}\\n\\n` (then close, no [DONE]) for an
error after the stream started. Anthropic's Messages and OpenAI's Responses streams name each event
(`NAMED`): `event: <its "type">\\ndata: {json}\\n\\n`, and nothing after the last event. Both
send `: comment\\n\\n` keep-alives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from collections.abc import AsyncIterable, Callable, Mapping
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = "data: [DONE]\n\n"

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def data(payload: dict[str, Any]) -> str:
    """One `data:` event carrying a JSON object."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def named(payload: dict[str, Any]) -> str:
    """One event named by the payload's "type" (Anthropic Messages, OpenAI Responses)."""
    return f"event: {payload['type']}\n{data(payload)}"


@dataclass(frozen=True)
class Framing:
    """How one API frames its stream: each event, the closing frame (if any)."""

    event: Callable[[dict[str, Any]], str]
    end: str | None


DATA_ONLY = Framing(event=data, end=DONE)
NAMED = Framing(event=named, end=None)


def comment(text: str) -> str:
    """A comment line: ignored by SSE parsers, keeps proxies and clients from timing out."""
    return f": {text}\n\n"


class SSEResponse(StreamingResponse):
    """An event stream that always watches for the client going away.

    Starlette only listens for `http.disconnect` below ASGI spec 2.4; we always do, so a client
    that leaves while we wait for the engine (queue, prefill) cancels the body iterator at once,
    whose cleanup cancels the engine request.
    """

    media_type = "text/event-stream"

    def __init__(self, frames: AsyncIterable[str], headers: Mapping[str, str] | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        super().__init__(frames, headers=headers)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream_then_stop() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass  # the client went away mid-write; the iterator's cleanup ran
                    group.cancel_scope.cancel()

                group.start_soon(stream_then_stop)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            # Also covers a body iterator that never started (its own cleanup would not run).
            if self._on_close is not None:
                self._on_close()
