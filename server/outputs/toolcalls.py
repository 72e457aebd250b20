"""Streaming tool-call parsers, one per output format (`hermes`, `llama3`, `mistral`).

All share `ToolCallParser`: plain text is `Content`, streamed as it comes except a tail that could be
the start of a call marker. A call is buffered until it is complete, then emitted as one `ToolCallStart`
and one `ToolCallArgs` holding `json.dumps(arguments, ensure_ascii=False)` (so every chunking gives the
same events). Rules:
- A call whose body is not valid JSON, or has no name, is emitted as `Content`, marker included, as is a
  call still open at `finish()`: no text is ever lost.
- Whitespace between calls, and after the last call up to the end, is dropped; whitespace followed by
  text stays content. Whitespace before a call is dropped only where a call may only begin after
  whitespace (Llama's start of output; after another call).
- `max_calls` (1 for `parallel_tool_calls: false`): calls after the first `max_calls` are dropped, and
  their text is not emitted either.
"""

from __future__ import annotations

import re
from typing import Any

from server.outputs.events import Content, Event, IdFactory, ToolCallArgs, ToolCallStart, new_call_id
from server.outputs.scan import (
    JsonScanner,
    ParsedCall,
    call_from_json,
    could_become_any,
    dump_args,
    find_first,
    loads,
    partial_suffix,
    starts_with_any,
)

Body = tuple[int, list[ParsedCall] | None]  # (body chars consumed, the calls, or None when malformed)


class ToolCallParser:
    """The streaming skeleton; a family sets its markers and decodes a call body in `_parse_body`."""

    OPENERS: tuple[str, ...] = ()  # texts that open a call
    INLINE: frozenset[str] = frozenset()  # openers that are also the body's first char (Llama's `{`)
    ANYWHERE = True  # openers count anywhere in the text, not only at the start and after a call
    SEPARATOR = ""  # what may sit between two calls besides whitespace (Llama's `;`)

    def __init__(self, max_calls: int | None = None, id_factory: IdFactory = new_call_id) -> None:
        self._max_calls = max_calls
        self._new_id = id_factory
        self._buf = ""
        self._opener: str | None = None  # while a call is buffered: its raw text before the body
        self._scan: JsonScanner | None = None  # the buffered call's JSON scan state
        self._expect = not self.ANYWHERE  # a call may begin here after whitespace
        self._after_call = False  # ...and that whitespace follows a call
        self._seen = 0  # calls parsed, kept or dropped
        self._emitted = 0  # calls emitted: the next call's index

    def push(self, text: str) -> list[Event]:
        """Events for the next piece of content text."""
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        """Events for the held-back text; a call still open comes out as its raw text."""
        out = self._drain(final=True)
        if self._opener is not None:
            self._content(out, self._opener + self._buf)
            self._opener, self._buf = None, ""
        return out

    def _parse_body(self, body: str) -> Body | None:
        """Decode the call body at the start of `body` (the text after the opener); None while incomplete."""
        raise NotImplementedError

    def _drain(self, final: bool) -> list[Event]:
        """Run the state machine until it needs more text."""
        out: list[Event] = []
        while True:
            if self._opener is not None:
                if not self._step_call(out):
                    return out
            elif self._expect:
                if not self._step_expect(final):
                    return out
            else:
                self._step_text(out, final)
                if self._opener is None:
                    return out

    def _step_text(self, out: list[Event], final: bool) -> None:
        """Plain text: emit it up to the first opener (which starts a call) or up to a partial opener."""
        hit = find_first(self._buf, self.OPENERS) if self.ANYWHERE else None
        if hit is not None:
            index, opener = hit
            self._content(out, self._buf[:index])
            self._begin_call("", opener, self._buf[index:])
            return
        keep = 0 if final or not self.ANYWHERE else partial_suffix(self._buf, self.OPENERS)
        self._content(out, self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]

    def _step_expect(self, final: bool) -> bool:
        """Where a call may begin after whitespace: start one, wait, or fall back to plain text."""
        rest = self._buf.lstrip()
        if self._after_call and self.SEPARATOR and rest.startswith(self.SEPARATOR):
            self._buf = rest[len(self.SEPARATOR) :]
            return True
        opener = starts_with_any(rest, self.OPENERS)
        if opener is not None:
            self._begin_call(self._buf[: len(self._buf) - len(rest)], opener, rest)
            return True
        separators = (self.SEPARATOR,) if self._after_call and self.SEPARATOR else ()
        if not final and could_become_any(rest, self.OPENERS + separators):
            return False
        if self._after_call and not rest:
            self._buf = ""  # trailing whitespace after the last call
        self._expect = self._after_call = False
        return True

    def _begin_call(self, space: str, opener: str, text: str) -> None:
        """Buffer a call: `text` starts with `opener`; `space` is the whitespace skipped before it."""
        size = 0 if opener in self.INLINE else len(opener)
        self._opener, self._buf, self._scan = space + text[:size], text[size:], None

    def _step_call(self, out: list[Event]) -> bool:
        """Inside a call: once its body is complete, emit it (or its raw text if it is not a call)."""
        parsed = self._parse_body(self._buf)
        if parsed is None:
            return False
        used, calls = parsed
        raw = (self._opener or "") + self._buf[:used]
        self._opener, self._buf = None, self._buf[used:]
        if calls is None:
            self._content(out, raw)
            self._expect = self._after_call = False
        else:
            self._emit_calls(out, calls)
            self._expect = self._after_call = True
        return True

    def _emit_calls(self, out: list[Event], calls: list[ParsedCall]) -> None:
        """ToolCallStart + ToolCallArgs per call, dropping those beyond `max_calls`."""
        for name, args in calls:
            self._seen += 1
            if self._max_calls is not None and self._seen > self._max_calls:
                continue
            index, self._emitted = self._emitted, self._emitted + 1
            out += [ToolCallStart(index, self._new_id(), name), ToolCallArgs(index, dump_args(args))]

    @staticmethod
    def _content(out: list[Event], text: str) -> None:
        """Append a content piece if it is not empty."""
        if text:
            out.append(Content(text))

    def _object_at(self, body: str, start: int) -> tuple[int, Any] | None:
        """(end, decoded value) of the JSON object/array opening at `body[start]`; None while it is open."""
        if self._scan is None:
            self._scan = JsonScanner(start)
        end = self._scan.value_end(body)
        return None if end is None else (end, loads(body[start:end]))


def _first_char(body: str) -> int | None:
    """Index of the first non-whitespace character, None if there is none yet."""
    rest = body.lstrip()
    return len(body) - len(rest) if rest else None


class HermesParser(ToolCallParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, anywhere in the text (Hermes, Qwen, SmolLM3)."""

    OPENERS = ("<tool_call>",)
    CLOSE = "</tool_call>"

    def _parse_body(self, body: str) -> Body | None:
        """The body runs to the first `</tool_call>` outside a JSON string."""
        if self._scan is None:
            self._scan = JsonScanner()
        end = self._scan.find_tag(body, self.CLOSE)
        if end is None:
            return None
        call = call_from_json(loads(body[:end]))
        return end + len(self.CLOSE), [call] if call else None


class Llama3Parser(ToolCallParser):
    """Llama 3.x: the output opens with `{"name": ..., "parameters": {...}}` (or `<|python_tag|>` first);
    more calls may follow, separated by `;`. Output that starts otherwise is plain content."""

    OPENERS = ("<|python_tag|>", "{")
    INLINE = frozenset({"{"})
    ANYWHERE = False
    SEPARATOR = ";"

    def _parse_body(self, body: str) -> Body | None:
        """One JSON object, after optional whitespace (following `<|python_tag|>`)."""
        start = _first_char(body)
        if start is None:
            return None
        if body[start] != "{":
            return 0, None  # e.g. `<|python_tag|>brave_search.call(...)`: built-in tools are not served
        found = self._object_at(body, start)
        if found is None:
            return None
        call = call_from_json(found[1])
        return found[0], [call] if call else None


class MistralParser(ToolCallParser):
    """Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (tokenizers before v11), or
    `[TOOL_CALLS]name[ARGS]{...}` once per call (v11+; `[ARGS]` may be absent, `[CALL_ID]id` may precede it)."""

    OPENERS = ("[TOOL_CALLS]",)
    _HEAD = re.compile(r"([\w.\-]+)(?:\[CALL_ID\]\w*)?(?:\[ARGS\])?\s*(?=\{)")
    _HEAD_SO_FAR = re.compile(r"[\w.\-]+(?:\[CALL_ID\]\w*)?(?:\[ARGS\])?\s*")

    def _parse_body(self, body: str) -> Body | None:
        """An array of calls, or a name then the arguments object."""
        start = _first_char(body)
        if start is None:
            return None
        if body[start] == "[":
            found = self._object_at(body, start)
            return None if found is None else (found[0], _calls_from_array(found[1]))
        head = self._HEAD.match(body, start)
        if head is None:
            return None if self._head_may_follow(body[start:]) else (0, None)
        found = self._object_at(body, head.end())
        if found is None:
            return None
        call = call_from_json({"name": head[1], "arguments": found[1]})
        return found[0], [call] if call else None

    def _head_may_follow(self, text: str) -> bool:
        """Whether `text` is the start of `name[CALL_ID]id[ARGS]` (each tag possibly cut)."""
        text = text[: len(text) - partial_suffix(text, ("[CALL_ID]", "[ARGS]"))]
        return not text or self._HEAD_SO_FAR.fullmatch(text) is not None


def _calls_from_array(value: Any) -> list[ParsedCall] | None:
    """Every element of a non-empty list decoded as a call, or None if any is not one."""
    if not isinstance(value, list) or not value:
        return None
    calls = [call for item in value if (call := call_from_json(item)) is not None]
    return calls if len(calls) == len(value) else None


PARSERS: dict[str, type[ToolCallParser]] = {"hermes": HermesParser, "llama3": Llama3Parser, "mistral": MistralParser}


def make_tool_parser(fmt: str, max_calls: int | None = None, id_factory: IdFactory = new_call_id) -> ToolCallParser:
    """A parser for format `fmt` (a key of `PARSERS`)."""
    return PARSERS[fmt](max_calls=max_calls, id_factory=id_factory)
