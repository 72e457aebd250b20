"""The output pipeline the server calls: reasoning split first, then tool calls in the content stream.

Tool calls written inside reasoning are not parsed: they stay reasoning text. `merge` and `accumulate`
turn the events into the non-streamed reply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from server.outputs.events import Content, Event, IdFactory, Reasoning, ToolCallArgs, ToolCallStart, new_call_id
from server.outputs.formats import detect_format
from server.outputs.reasoning import ReasoningSplitter
from server.outputs.toolcalls import ToolCallParser, make_tool_parser


@dataclass(frozen=True)
class Message:
    """A whole reply: `content`/`reasoning` are None when empty; `tool_calls` in OpenAI's shape."""

    content: str | None
    reasoning: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class OutputParser:
    """Chains an optional `ReasoningSplitter` and an optional tool-call parser."""

    def __init__(self, reasoning: ReasoningSplitter | None, tools: ToolCallParser | None) -> None:
        self._reasoning = reasoning
        self._tools = tools

    def push(self, text: str) -> list[Event]:
        """Events for the next piece of generated text."""
        return self._route(self._reasoning.push(text) if self._reasoning else [Content(text)])

    def finish(self) -> list[Event]:
        """Events for everything held back, at the end of the output."""
        out = self._route(self._reasoning.finish()) if self._reasoning else []
        return out + (self._tools.finish() if self._tools else [])

    def _route(self, events: list[Event]) -> list[Event]:
        """Send content through the tool parser; drop empty content pieces."""
        out: list[Event] = []
        for event in events:
            if not isinstance(event, Content):
                out.append(event)
            elif self._tools is not None:
                out += self._tools.push(event.text)
            elif event.text:
                out.append(event)
        return out


def merge(events: list[Event]) -> list[Event]:
    """Coalesce adjacent Content, adjacent Reasoning, and adjacent ToolCallArgs of the same call."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, (Content, Reasoning)) and type(last) is type(event):
            out[-1] = type(event)(last.text + event.text)  # type: ignore[union-attr]
        elif isinstance(event, ToolCallArgs) and isinstance(last, ToolCallArgs) and last.index == event.index:
            out[-1] = ToolCallArgs(event.index, last.text + event.text)
        else:
            out.append(event)
    return out


def accumulate(events: list[Event]) -> Message:
    """The whole reply the events describe."""
    content, reasoning, calls = [], [], {}
    for event in events:
        if isinstance(event, Content):
            content.append(event.text)
        elif isinstance(event, Reasoning):
            reasoning.append(event.text)
        elif isinstance(event, ToolCallStart):
            calls[event.index] = {"id": event.id, "type": "function", "function": {"name": event.name, "arguments": ""}}
        elif isinstance(event, ToolCallArgs):
            calls[event.index]["function"]["arguments"] += event.text
    return Message("".join(content) or None, "".join(reasoning) or None, [calls[i] for i in sorted(calls)])


def make_parser(
    chat_template: str | None,
    tools_requested: bool,
    thinking: bool,
    max_calls: int | None,
    prompt_ends_in_think: bool,
    *,
    id_factory: IdFactory = new_call_id,
) -> OutputParser:
    """The parser for one request.

    thinking: the template may think, so a leading `<think>` opens reasoning. prompt_ends_in_think: the
    rendered prompt already opened `<think>`, so the output starts inside reasoning. tools_requested: the
    request has tools (and tool_choice is not "none"); the format comes from the template, Hermes when it
    names none. max_calls: 1 for `parallel_tool_calls: false`, else None.
    """
    reasoning = (
        ReasoningSplitter(starts_in_reasoning=prompt_ends_in_think) if thinking or prompt_ends_in_think else None
    )
    fmt = detect_format(chat_template) or "hermes"
    tools = make_tool_parser(fmt, max_calls=max_calls, id_factory=id_factory) if tools_requested else None
    return OutputParser(reasoning, tools)
