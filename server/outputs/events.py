"""The events the output parsers emit while a reply streams, and the tool-call id factory.

A reply is a sequence of events: answer text (`Content`), thinking text (`Reasoning`), and for each tool
call one `ToolCallStart` followed by `ToolCallArgs` fragments. The fragments of one call concatenate to
`json.dumps(arguments, ensure_ascii=False)`: OpenAI's `function.arguments` is a JSON string.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Content:
    """A piece of the answer text (OpenAI `content`)."""

    text: str


@dataclass(frozen=True)
class Reasoning:
    """A piece of the thinking text (the `reasoning_content` / `reasoning` delta)."""

    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """A tool call begins: `index` is its 0-based position among this reply's calls."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgs:
    """A fragment of tool call `index`'s arguments JSON string."""

    index: int
    text: str


Event = Content | Reasoning | ToolCallStart | ToolCallArgs

IdFactory = Callable[[], str]


def new_call_id() -> str:
    """A fresh OpenAI-style tool call id: `call_` and 24 random hex digits."""
    return "call_" + secrets.token_hex(12)
