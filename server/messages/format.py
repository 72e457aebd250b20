"""Anthropic Messages replies and stream events for one request, from the chat path's parsed output.

The text is split by the same parsers as a chat reply (`ChatFormatter`: tool calls, reasoning); each
kind becomes a content block: reasoning a `thinking` block, text a `text` block, each call a
`tool_use` block. A stream sends `message_start` and a `ping`, then for each block
`content_block_start`, its deltas (`thinking_delta`, `text_delta`, `input_json_delta`) and
`content_block_stop`, then `message_delta` (stop reason, output tokens, `dspark_stats`) and
`message_stop`. Usage counts prompt tokens restored from the prefix cache as
`cache_read_input_tokens`, apart from `input_tokens`, as Anthropic does.
"""

from __future__ import annotations

import json
from typing import Any

from engine.api import Finished, TokenEvent
from server import sse
from server.convert import ChatFormatter
from server.errors import APIError
from server.outputs.events import Content, Reasoning, ToolCallArgs, ToolCallStart
from server.outputs.pipeline import merge

# Anthropic's error types by HTTP status (its API reference, "Errors").
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error", 529: "overloaded_error"}


ERROR_SCHEMA = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"], "properties": {
        "type": {"type": "string"}, "message": {"type": "string"}}}}}
STOP_REASONS = ["end_turn", "max_tokens", "stop_sequence", "tool_use"]
MESSAGE_SCHEMA = {"type": "object", "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
                  "properties": {
                      "id": {"type": "string"}, "type": {"const": "message"}, "role": {"const": "assistant"},
                      "model": {"type": "string"},
                      "content": {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {
                          "type": {"enum": ["text", "thinking", "tool_use"]}}}},
                      "stop_reason": {"enum": [*STOP_REASONS, None]}, "stop_sequence": {"type": ["string", "null"]},
                      "usage": {"type": "object", "required": ["input_tokens", "output_tokens"], "properties": {
                          "input_tokens": {"type": "integer", "minimum": 0},
                          "output_tokens": {"type": "integer", "minimum": 0}}}}}
EVENT_TYPES = ["message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop",
               "message_delta", "message_stop", "error"]


def openapi_responses(*error_statuses: int, stream: bool = True) -> dict[int | str, dict[str, Any]]:
    """`responses=` of a Messages route: the message (or its named events) and Anthropic's errors."""
    event = {"type": "object", "required": ["event", "data"], "properties": {
        "event": {"enum": EVENT_TYPES}, "data": {"type": "string", "contentMediaType": "application/json",
                                                 "contentSchema": {"type": "object", "required": ["type"]}}}}
    content: dict[str, Any] = {"application/json": {"schema": MESSAGE_SCHEMA}}
    if stream:
        content["text/event-stream"] = {"itemSchema": event}
    out: dict[int | str, dict[str, Any]] = {200: {"description": "The message, or with `stream: true` its events, "
                                                                 "each named by its type", "content": content}}
    for status in error_statuses:
        out[status] = {"description": f"Anthropic's error envelope ({ERROR_TYPES.get(status, 'api_error')})",
                       "content": {"application/json": {"schema": ERROR_SCHEMA}}}
    return out


def error_envelope(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error body for an HTTP status."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class MessagesFormatter(ChatFormatter):
    """Anthropic message objects and events for one request."""

    framing = sse.NAMED

    def __init__(self, request_id: str, model: str, spec, prompt_tokens: int) -> None:
        super().__init__(request_id, model, include_usage=False, spec=spec)
        self._prompt_tokens = prompt_tokens
        self._open: tuple[int, type] | None = None  # the streamed block now open: (index, event kind)
        self._blocks = 0  # blocks started so far

    @staticmethod
    def error_body(error: APIError) -> dict[str, Any]:
        """An error after the stream started: Anthropic's `error` event."""
        return error_envelope(error.status, error.message)

    # ------------------------------------------------------------------ stream

    def opening(self) -> list[dict[str, Any]]:
        """`message_start` with an empty message, then a `ping`."""
        message = self._message([], None, None, {"input_tokens": self._prompt_tokens, "output_tokens": 0})
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def delta(self, event: TokenEvent) -> list[dict[str, Any]]:
        """The block events of one engine round (none while the parser holds text back)."""
        return self._events(self._push(event))

    def closing(self, finished: Finished) -> list[dict[str, Any]]:
        """The held-back text, the last block's stop, `message_delta` and `message_stop`."""
        out = self._events(self._tail(finished))
        if self._open is not None:
            out.append({"type": "content_block_stop", "index": self._open[0]})
        usage = self._usage_of(finished)
        out.append({"type": "message_delta",
                    "delta": {"stop_reason": self._stop_reason(finished), "stop_sequence": finished.stop_sequence},
                    "usage": {"output_tokens": usage["output_tokens"]}, "dspark_stats": finished.stats.as_dict()})
        out.append({"type": "message_stop"})
        return out

    def _events(self, parsed: list[Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ev in merge(parsed):
            if isinstance(ev, ToolCallStart) or self._open is None or (
                    not isinstance(ev, ToolCallArgs) and type(ev) is not self._open[1]):
                out += self._start(ev)
            if not isinstance(ev, ToolCallStart):  # a tool_use block starts with its name; its input follows
                out.append({"type": "content_block_delta", "index": self._open[0], "delta": _delta(ev)})
        return out

    def _start(self, ev: Any) -> list[dict[str, Any]]:
        """Close the open block and open the one `ev` belongs to."""
        out = [] if self._open is None else [{"type": "content_block_stop", "index": self._open[0]}]
        self._open = (self._blocks, type(ev))
        self._blocks += 1
        return out + [{"type": "content_block_start", "index": self._open[0], "content_block": _empty_block(ev)}]

    # ------------------------------------------------------------------ non-streaming

    def response(self, events: list[TokenEvent], finished: Finished) -> dict[str, Any]:
        """The whole message."""
        parsed: list[Any] = []
        for event in events:
            parsed += self._push(event)
        blocks: list[dict[str, Any]] = []
        for ev in merge(parsed + self._tail(finished)):
            _add(blocks, ev)
        return self._message(blocks, self._stop_reason(finished), finished.stop_sequence, self._usage_of(finished),
                             dspark_stats=finished.stats.as_dict())

    # ------------------------------------------------------------------ shared

    def _message(self, content: list[dict[str, Any]], stop_reason: str | None, stop_sequence: str | None,
                 usage: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage, **extra}

    def _stop_reason(self, finished: Finished) -> str:
        if finished.reason == "length":
            return "max_tokens"
        if ToolCallStart in self._kinds:
            return "tool_use"
        return "stop_sequence" if finished.stop_sequence is not None else "end_turn"

    def _usage_of(self, finished: Finished) -> dict[str, Any]:
        u = finished.usage
        return {"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
                "cache_read_input_tokens": u.cached_tokens, "cache_creation_input_tokens": 0}


def _empty_block(ev: Any) -> dict[str, Any]:
    if isinstance(ev, Reasoning):
        return {"type": "thinking", "thinking": "", "signature": ""}
    if isinstance(ev, ToolCallStart):
        return {"type": "tool_use", "id": ev.id, "name": ev.name, "input": {}}
    return {"type": "text", "text": ""}


def _delta(ev: Any) -> dict[str, Any]:
    if isinstance(ev, Reasoning):
        return {"type": "thinking_delta", "thinking": ev.text}
    if isinstance(ev, ToolCallArgs):
        return {"type": "input_json_delta", "partial_json": ev.text}
    assert isinstance(ev, Content), ev
    return {"type": "text_delta", "text": ev.text}


def _add(blocks: list[dict[str, Any]], ev: Any) -> None:
    """Add one merged event to a whole message's content: a call's arguments fill its tool_use
    block; anything else starts a block (`merge` has already joined adjacent text of one kind)."""
    if isinstance(ev, ToolCallArgs):
        blocks[-1]["input"] = json.loads(ev.text)
    else:
        blocks.append(_empty_block(ev))
        if isinstance(ev, Reasoning):
            blocks[-1]["thinking"] = ev.text
        elif isinstance(ev, Content):
            blocks[-1]["text"] = ev.text
