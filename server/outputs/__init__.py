"""Split generated text into reasoning, answer content and tool calls, streaming, for the chat API.

Pure Python (no MLX, no FastAPI): the server builds one parser per request with `make_parser`, feeds it
each round's text with `push`, calls `finish` at the end, and renders the events it gets back.
"""

from server.outputs.events import Content, Event, Reasoning, ToolCallArgs, ToolCallStart, new_call_id
from server.outputs.formats import detect_format, hermes_tool_system_prompt
from server.outputs.pipeline import Message, OutputParser, accumulate, make_parser, merge
from server.outputs.reasoning import ReasoningSplitter
from server.outputs.toolcalls import HermesParser, Llama3Parser, MistralParser, ToolCallParser, make_tool_parser

__all__ = [
    "Content",
    "Event",
    "HermesParser",
    "Llama3Parser",
    "Message",
    "MistralParser",
    "OutputParser",
    "Reasoning",
    "ReasoningSplitter",
    "ToolCallArgs",
    "ToolCallParser",
    "ToolCallStart",
    "accumulate",
    "detect_format",
    "hermes_tool_system_prompt",
    "make_parser",
    "make_tool_parser",
    "merge",
    "new_call_id",
]
