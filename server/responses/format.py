"""Responses events and objects from the chat formatter's chunks.

`server.convert.ChatFormatter` parses the model's text (reasoning, tool calls) exactly as for a chat
completion; this formatter turns its deltas into output items in the order they appear: a reasoning
item for thinking, a message for answer text, a function_call per tool call. Each item streams as
`response.output_item.added`, its content part and text (or arguments) deltas, then the `.done`
events; the stream opens with `response.created` and `response.in_progress` and ends with
`response.completed` (or `response.incomplete` when the token limit cut the reply) carrying the whole
response. A non-streaming reply is built by running the same events, so a stream accumulates to it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from engine.api import Finished, TokenEvent
from server import sse
from server.convert import DEFAULT_TEMPERATURE, ChatFormatter
from server.errors import APIError
from server.prompt import OutputSpec
from server.responses.protocol import (
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputText,
    ReasoningText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)

# Item kind -> (its id prefix, its text delta event); function calls stream their arguments.
KINDS = {"message": ("msg", "response.output_text.delta"), "reasoning": ("rs", "response.reasoning_text.delta"),
         "function_call": ("fc", "response.function_call_arguments.delta")}


def new_id(prefix: str) -> str:
    """A fresh id in OpenAI's form: `resp_...`, `msg_...`, `rs_...`, `fc_...`."""
    return f"{prefix}_{uuid.uuid4().hex}"


def echo(model: str, body: ResponsesRequest) -> dict[str, Any]:
    """The request's settings as every response object repeats them (OpenAI's defaults where unset)."""
    return {
        "model": model, "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
        "temperature": DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "text": {"format": body.format or {"type": "text"}}, "tool_choice": body.tool_choice or "auto",
        "tools": [tool.model_dump() for tool in body.tools or []],
    }


@dataclass
class _Item:
    """The output item being streamed."""

    kind: str  # a key of KINDS
    id: str
    index: int  # its output_index
    text: str = ""  # the answer or reasoning text, or the call's arguments
    call_id: str = ""
    name: str = ""

    def output(self, status: str, done: bool) -> OutputItem:
        """The item as `output_item.added` (not `done`: no content yet) or `.done` shows it."""
        if self.kind == "message":
            return OutputMessage(id=self.id, status=status, content=[OutputText(text=self.text)] if done else [])
        if self.kind == "reasoning":
            return OutputReasoning(id=self.id, content=[ReasoningText(text=self.text)] if done else [])
        return OutputFunctionCall(id=self.id, call_id=self.call_id, name=self.name, status=status,
                                  arguments=self.text if done else "")

    def part(self) -> dict[str, Any]:
        """Its content part (message and reasoning items have one)."""
        part = OutputText(text=self.text) if self.kind == "message" else ReasoningText(text=self.text)
        return part.model_dump(mode="json")


class ResponsesFormatter:
    """Responses events (streaming) and the response object of one request."""

    framing = sse.NAMED

    def __init__(self, response_id: str, model: str, body: ResponsesRequest, spec: OutputSpec) -> None:
        self.id = response_id
        self._chat = ChatFormatter(response_id, model, include_usage=True, spec=spec)  # the usage chunk: counts
        self._echo = echo(model, body)
        self._sequence = 0
        self._items: list[OutputItem] = []  # the finished items
        self._open: _Item | None = None
        self._calls: dict[int, _Item] = {}  # chat's tool call index -> its item
        self._reason: str | None = None
        self._stats: dict[str, Any] | None = None
        self._usage: dict[str, Any] | None = None
        self.final: dict[str, Any] | None = None  # the response object, once closed

    def error_body(self, error: APIError) -> dict[str, Any]:
        """An error after the stream started: the `error` event."""
        return self._event("error", code=error.code, message=error.message, param=error.param)

    def opening(self) -> list[dict[str, Any]]:
        """`response.created` and `response.in_progress`, with no output yet."""
        skeleton = self._object("in_progress")
        return [self._event("response.created", response=skeleton),
                self._event("response.in_progress", response=skeleton)]

    def delta(self, event: TokenEvent) -> list[dict[str, Any]]:
        """The events of one engine round (none while the chat parser holds its text back)."""
        return self._translate(self._chat.delta(event))

    def closing(self, finished: Finished) -> list[dict[str, Any]]:
        """Held-back text, the last item's `.done` events, then `response.completed` or `.incomplete`."""
        events = self._translate(self._chat.closing(finished))
        status = "incomplete" if self._reason == "length" else "completed"
        if self._open is None and not self._items:  # nothing at all: one empty message, as OpenAI answers
            events += self._start("message")
        events += self._finish(status)
        self.final = self._object(status, output=self._items, usage=self._response_usage(), stats=self._stats)
        events.append(self._event(f"response.{status}", response=self.final))
        return events

    def response(self, events: list[TokenEvent], finished: Finished) -> dict[str, Any]:
        """The non-streaming reply: the response the stream's events would have built."""
        for event in events:
            self.delta(event)
        self.closing(finished)
        assert self.final is not None
        return self.final

    # ------------------------------------------------------------------ chat chunks -> events

    def _translate(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Events for chat chunks: each delta carries reasoning, content or one tool call piece."""
        events: list[dict[str, Any]] = []
        for chunk in chunks:
            if chunk.get("usage"):
                self._usage = chunk["usage"]
            for choice in chunk["choices"]:
                delta = choice["delta"]
                if delta.get("reasoning_content"):
                    events += self._text("reasoning", delta["reasoning_content"])
                if delta.get("content"):
                    events += self._text("message", delta["content"])
                for call in delta.get("tool_calls") or []:
                    events += self._call(call)
                if choice.get("finish_reason"):
                    self._reason, self._stats = choice["finish_reason"], chunk.get("dspark_stats")
        return events

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        events = [] if self._open is not None and self._open.kind == kind else self._start(kind)
        item = self._open
        assert item is not None
        item.text += text
        return events + [self._text_delta(item, text)]

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        """A tool call starts (it has an id) or its arguments continue."""
        events: list[dict[str, Any]] = []
        if call.get("id"):
            events = self._start("function_call", call_id=call["id"], name=call["function"]["name"])
            assert self._open is not None
            self._calls[call["index"]] = self._open
        item = self._calls[call["index"]]
        arguments = call["function"].get("arguments")
        if arguments:
            item.text += arguments
            events.append(self._text_delta(item, arguments))
        return events

    def _text_delta(self, item: _Item, text: str) -> dict[str, Any]:
        if item.kind == "function_call":
            return self._event(KINDS[item.kind][1], item_id=item.id, output_index=item.index, delta=text)
        extra = {"logprobs": []} if item.kind == "message" else {}
        return self._event(KINDS[item.kind][1], item_id=item.id, output_index=item.index, content_index=0,
                           delta=text, **extra)

    def _start(self, kind: str, **call: str) -> list[dict[str, Any]]:
        """Finish the open item and open a `kind` item (with its empty content part)."""
        events = self._finish("completed")
        item = self._open = _Item(kind, new_id(KINDS[kind][0]), len(self._items), **call)
        events.append(self._event("response.output_item.added", output_index=item.index,
                                  item=item.output("in_progress", done=False).model_dump(mode="json")))
        if kind != "function_call":
            events.append(self._event("response.content_part.added", item_id=item.id, output_index=item.index,
                                      content_index=0, part=item.part()))
        return events

    def _finish(self, status: str) -> list[dict[str, Any]]:
        """The `.done` events of the open item, if any (`status`: "completed", or "incomplete" when cut)."""
        item, self._open = self._open, None
        if item is None:
            return []
        where = {"item_id": item.id, "output_index": item.index}
        if item.kind == "function_call":
            events = [self._event("response.function_call_arguments.done", **where, arguments=item.text)]
        else:
            kind = "output_text" if item.kind == "message" else "reasoning_text"
            extra = {"logprobs": []} if item.kind == "message" else {}
            events = [self._event(f"response.{kind}.done", **where, content_index=0, text=item.text, **extra),
                      self._event("response.content_part.done", **where, content_index=0, part=item.part())]
        output = item.output(status, done=True)
        self._items.append(output)
        events.append(self._event("response.output_item.done", output_index=item.index,
                                  item=output.model_dump(mode="json")))
        return events

    # ------------------------------------------------------------------ objects

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _object(self, status: str, output: list[OutputItem] | None = None, usage: ResponseUsage | None = None,
                stats: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = ResponseObject(id=self.id, created_at=self._chat.created, status=status, output=output or [],
                               incomplete_details={"reason": "max_output_tokens"} if status == "incomplete" else None,
                               usage=usage, dspark_stats=stats, **self._echo)
        body = reply.model_dump(mode="json")
        if body["dspark_stats"] is None:
            del body["dspark_stats"]
        return body

    def _response_usage(self) -> ResponseUsage | None:
        """Chat's usage in the Responses names (reasoning tokens 0 when the model does not think)."""
        u = self._usage
        if u is None:
            return None
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        reasoning = (u.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
        return ResponseUsage(input_tokens=u["prompt_tokens"], input_tokens_details={"cached_tokens": cached},
                             output_tokens=u["completion_tokens"], output_tokens_details={"reasoning_tokens": reasoning},
                             total_tokens=u["total_tokens"])
