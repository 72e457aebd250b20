"""Helpers shared by the streaming parsers: marker hold-back, string-aware JSON scanning, call decoding.

The engine releases several tokens per round, so a marker (`</think>`, `<tool_call>`) can be cut
anywhere. Every parser therefore keeps back the tail of its buffer that could still grow into a marker
(`partial_suffix`), and scans JSON with `JsonScanner`, which remembers where it stopped so that each
character is looked at once however the text was chunked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

ParsedCall = tuple[str, dict[str, Any]]  # (function name, arguments object)


def partial_suffix(text: str, markers: Iterable[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a marker: it must wait for more text."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


def find_first(text: str, markers: Iterable[str]) -> tuple[int, str] | None:
    """The earliest (index, marker) of any marker in `text`, or None."""
    hits = [(i, m) for m in markers if (i := text.find(m)) >= 0]
    return min(hits, key=lambda hit: (hit[0], -len(hit[1]))) if hits else None


def starts_with_any(text: str, markers: Iterable[str]) -> str | None:
    """The marker `text` starts with, or None."""
    return next((m for m in markers if text.startswith(m)), None)


def could_become_any(text: str, markers: Iterable[str]) -> bool:
    """Whether more text could still make `text` start with a marker (`text` is a prefix of one)."""
    return any(m.startswith(text) for m in markers)


class JsonScanner:
    """Walks JSON text left to right across pushes, tracking strings (and their escapes) and bracket depth.

    The caller passes the whole body each time (it only grows); scanning resumes at `pos`.
    """

    def __init__(self, start: int = 0) -> None:
        self.pos = start
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def _step(self, ch: str) -> None:
        """Account for one character."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
        elif ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1

    def value_end(self, text: str) -> int | None:
        """Index just past the object/array that starts at the scanner's start, or None while it is open."""
        while self.pos < len(text):
            self._step(text[self.pos])
            self.pos += 1
            if self.depth <= 0 and not self.in_string:
                return self.pos
        return None

    def find_tag(self, text: str, tag: str) -> int | None:
        """Index of the first `tag` outside any JSON string (a `</tool_call>` inside an argument value
        does not close the call), or None until it has fully arrived. `tag` must not contain quotes."""
        while self.pos < len(text):
            ch = text[self.pos]
            if not self.in_string and ch == tag[0]:
                if text.startswith(tag, self.pos):
                    return self.pos
                if len(text) - self.pos < len(tag) and tag.startswith(text[self.pos :]):
                    return None  # the tag may be arriving: look here again on the next push
            self._step(ch)
            self.pos += 1
        return None


def _no_constants(name: str) -> Any:
    """Refuse NaN/Infinity: `json.dumps` would write them back as invalid JSON."""
    raise ValueError(name)


def loads(text: str) -> Any:
    """Decode strict JSON; None when `text` is not valid JSON (no call body is ever `null`)."""
    try:
        return json.loads(text, parse_constant=_no_constants)
    except (ValueError, RecursionError):
        return None


def dump_args(arguments: dict[str, Any]) -> str:
    """The one canonical arguments string: `json.dumps(arguments, ensure_ascii=False)`."""
    return json.dumps(arguments, ensure_ascii=False)


def call_from_json(obj: Any) -> ParsedCall | None:
    """(name, arguments) from a decoded `{"name": ..., "arguments" | "parameters": {...}}`; None if not a call.

    Arguments that arrive already encoded as a JSON string are decoded; missing arguments mean `{}`.
    """
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    if isinstance(args, str):
        args = loads(args)
    return (name, args) if isinstance(args, dict) else None
