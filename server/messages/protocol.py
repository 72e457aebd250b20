"""Anthropic Messages API request shapes (`POST /v1/messages`, `/v1/messages/count_tokens`).

Only the request is modelled: the reply is built by `server.messages.format`. Content blocks stay
plain dicts here and are read by `server.messages.convert`, which names the block it refuses. Types
are strict as in server/protocol.py; unknown fields are ignored and reported (the tolerant policy).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from server.protocol import VISION_ONLY, Int

_CONFIG = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

# The content blocks served, as JSON Schema (the server reads them as dicts: `server.messages.convert`).
# Other keys of a block are ignored in either policy. Documents and server-tool blocks are not listed:
# they are refused with a 400 naming the block. Images are listed when the model takes them.
_STRING = {"type": "string"}


def _block(kind: str, required: tuple[str, ...] = (), **props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"type": {"const": kind}, **props},
            "required": ["type", *required], "additionalProperties": True}


_TEXT = _block("text", ("text",), text=_STRING)
_TEXTS = {"type": "array", "items": _TEXT}
_IMAGE_SOURCE = {"anyOf": [
    {"type": "object", "required": ["type", "media_type", "data"], "additionalProperties": True, "properties": {
        "type": {"const": "base64"}, "media_type": {"enum": ["image/png", "image/jpeg", "image/webp", "image/gif"]},
        "data": _STRING}},
    {"type": "object", "required": ["type", "url"], "additionalProperties": True,
     "properties": {"type": {"const": "url"}, "url": {"type": "string", "minLength": 1}}}]}
_USER_BLOCKS = [_TEXT, _block("tool_result", ("tool_use_id",), tool_use_id=_STRING,
                              content={"anyOf": [_STRING, _TEXTS]}, is_error={"type": "boolean"}),
                {**_block("image", ("source",), source=_IMAGE_SOURCE), VISION_ONLY: True}]
_ASSISTANT_BLOCKS = [_TEXT, _block("tool_use", ("id", "name"), id=_STRING, name=_STRING, input={"type": "object"}),
                     _block("thinking", ("thinking",), thinking=_STRING), _block("redacted_thinking")]


def _turn(role: str, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    content = {"anyOf": [_STRING, {"type": "array", "items": {"anyOf": blocks}, "minItems": 1}]}
    return {"type": "object", "properties": {"role": {"const": role}, "content": content},
            "required": ["role", "content"]}


MESSAGE_SCHEMA = {"anyOf": [_turn("user", _USER_BLOCKS), _turn("assistant", _ASSISTANT_BLOCKS)]}
SYSTEM_SCHEMA = {"anyOf": [_STRING, _TEXTS, {"type": "null"}]}
TOOL_CHOICE_SCHEMA = {"anyOf": [
    {"type": "object", "properties": {"type": {"enum": ["auto", "any", "none"]}, "name": {"type": ["string", "null"]},
                                      "disable_parallel_tool_use": {"type": ["boolean", "null"]}}, "required": ["type"]},
    {"type": "object", "properties": {"type": {"const": "tool"}, "name": {"type": "string", "minLength": 1},
                                      "disable_parallel_tool_use": {"type": ["boolean", "null"]}},
     "required": ["type", "name"]},
    {"type": "null"}]}
OUTPUT_FORMAT_SCHEMA = {"anyOf": [
    {"type": "object", "properties": {"type": {"const": "json_schema"}, "schema": {"type": "object"}},
     "required": ["type", "schema"], "additionalProperties": True},
    {"type": "null"}]}


class MessageParam(BaseModel):
    """One turn: `user` or `assistant`, a string or a list of content blocks."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False,
                              json_schema_extra=lambda schema, _: schema.update(MESSAGE_SCHEMA))
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class ToolParam(BaseModel):
    """A client tool. Anthropic's server tools (`web_search_...`, `bash_...`, ...) carry a `type`."""

    model_config = _CONFIG
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    type: Annotated[str | None, WithJsonSchema({"enum": ["custom", None]})] = Field(
        default=None, description='"custom" or absent; server tools are refused')


class ThinkingParam(BaseModel):
    """`thinking`: "disabled" switches the chat template's thinking off, any other type (enabled,
    adaptive, between_tools) on; the budget is not enforced."""

    model_config = _CONFIG
    type: str
    budget_tokens: Int | None = None


class OutputConfig(BaseModel):
    """`output_config`: `format` {"type": "json_schema", "schema"} is served as structured output;
    `effort` is accepted and not used."""

    model_config = _CONFIG
    format: Annotated[dict[str, Any] | None, WithJsonSchema(OUTPUT_FORMAT_SCHEMA)] = None
    effort: str | None = None


class ToolChoiceParam(BaseModel):
    """`tool_choice`: auto, any (a call is required), a named tool, or none."""

    model_config = _CONFIG
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class CountTokensRequest(BaseModel):
    """POST /v1/messages/count_tokens body: a conversation without generation settings."""

    model_config = _CONFIG
    model: str | None = Field(default=None, description="default: the served model")
    messages: list[MessageParam] = Field(min_length=1)
    system: Annotated[str | list[dict[str, Any]] | None, WithJsonSchema(SYSTEM_SCHEMA)] = None
    tools: list[ToolParam] | None = None
    tool_choice: Annotated[ToolChoiceParam | None, WithJsonSchema(TOOL_CHOICE_SCHEMA)] = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages body."""

    max_tokens: Int = Field(ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2, description="default 1.0; 0 is greedy")
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: Int | None = Field(default=None, ge=0)
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = Field(default=None, max_length=64)
    stream: bool | None = None
    metadata: Any = Field(default=None, description="accepted, not used")
