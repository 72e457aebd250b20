"""Split a thinking model's output into `Reasoning` (inside `<think>...</think>`) and `Content` (after it).

Whitespace, as llama.cpp's reasoning parser does it (vLLM keeps it; Qwen's own examples strip it): the
reasoning text is stripped at both ends, and the content starts at the first non-whitespace character
after `</think>`. So `<think>\\nhmm\\n</think>\\n\\nHi` gives reasoning `hmm` and content `Hi`. Leading
whitespace before `<think>` is dropped with it. The tags never appear in either stream.

Reasoning is recognised when the output starts (after whitespace) with `<think>`, or from the first
character when the prompt already opened it (`starts_in_reasoning`; a `<think>` the model repeats there is
dropped too). Otherwise the output is all content, passed through unchanged. An output that ends before
`</think>` (e.g. max_tokens) stays all reasoning.
"""

from __future__ import annotations

from server.outputs.events import Content, Event, Reasoning
from server.outputs.scan import partial_suffix

_OPENING, _REASONING, _AFTER, _CONTENT = range(4)


class ReasoningSplitter:
    """Streaming splitter: feed text with `push`, then call `finish` once at the end of the output."""

    def __init__(self, start: str = "<think>", end: str = "</think>", starts_in_reasoning: bool = False) -> None:
        self._start, self._end = start, end
        self._starts_in_reasoning = starts_in_reasoning
        self._state = _OPENING
        self._buf = ""
        self._began = False  # some reasoning text went out: leading whitespace is no longer stripped

    def push(self, text: str) -> list[Event]:
        """Events for the next piece of output; a possible partial tag or trailing whitespace is held back."""
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        """Events for whatever was held back."""
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[Event]:
        """Run the state machine until it needs more text."""
        out: list[Event] = []
        step = {_OPENING: self._opening, _REASONING: self._reasoning, _AFTER: self._after, _CONTENT: self._content}
        while step[self._state](out, final):
            pass
        return out

    def _opening(self, out: list[Event], final: bool) -> bool:
        """At the start: decide between reasoning and plain content."""
        rest = self._buf.lstrip()
        if rest.startswith(self._start):
            self._buf, self._state = rest[len(self._start) :], _REASONING
        elif not final and self._start.startswith(rest):
            return False  # only whitespace or the first chars of `<think>` so far
        elif self._starts_in_reasoning:
            self._buf, self._state = rest, _REASONING
        else:
            self._state = _CONTENT  # untouched: output without tags passes through as it is
        return True

    def _reasoning(self, out: list[Event], final: bool) -> bool:
        """Inside reasoning: emit up to `</think>`, holding back a partial tag and trailing whitespace."""
        if not self._began:
            self._buf = self._buf.lstrip()
        end = self._buf.find(self._end)
        if end >= 0:
            self._emit(out, self._buf[:end].rstrip())
            self._buf, self._state = self._buf[end + len(self._end) :], _AFTER
            return True
        safe = self._buf if final else self._buf[: len(self._buf) - partial_suffix(self._buf, [self._end])]
        text = safe.rstrip()  # trailing whitespace waits: it is dropped if `</think>` comes next
        self._emit(out, text)
        self._buf = "" if final else self._buf[len(text) :]
        return False

    def _after(self, out: list[Event], final: bool) -> bool:
        """After `</think>`: skip whitespace up to the first content character."""
        rest = self._buf.lstrip()
        self._buf = rest
        if rest:
            self._state = _CONTENT
        return bool(rest)

    def _content(self, out: list[Event], final: bool) -> bool:
        """After the reasoning (or without any): everything is content."""
        if self._buf:
            out.append(Content(self._buf))
            self._buf = ""
        return False

    def _emit(self, out: list[Event], text: str) -> None:
        """Append a reasoning piece if it is not empty."""
        if text:
            out.append(Reasoning(text))
            self._began = True
