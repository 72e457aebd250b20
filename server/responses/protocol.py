"""The shapes of `POST /v1/responses` as this server speaks it: the request, the response object, its
output items, and their JSON Schemas for the OpenAPI document.

Request policy as in server.protocol: strict types; fields not modelled here are ignored and reported in
`X-Dspark-Ignored` (refused under --strict-params), among them OpenAI's inert ones (`metadata`, `user`,
`store`, `truncation`, `include`, `service_tier`, `prompt_cache_key`, `reasoning.summary`). A 400 stays
for what would be served wrongly: tools other than functions, file/audio input, images for a model that
does not take them (`input_image` parts with an `image_url`, as chat's image parts), and the fields
that refer to state a server keeps (`previous_response_id`, `conversation`, `prompt`): this one keeps none.

The schemas are written out in full (no `$ref`): the route documents them inline, since the app's
components are the chat and completions models.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationInfo, WithJsonSchema, field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from server.protocol import TOLERANT_ONLY, VISION_ONLY, Int, images_from_the_user_only, invalid, unsupported

CONFIG = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)  # as server.protocol's request models

ITEM_KINDS = ("message", "function_call", "function_call_output", "reasoning")
ROLES = ("user", "system", "developer", "assistant")
PART_KINDS = ("input_text", "output_text", "refusal", "reasoning_text", "input_image")
# The content part types each item kind reads (in `content`, or `output` for a call's output).
PARTS_OF = {"message": ("input_text", "output_text", "refusal", "input_image"), "function_call_output": ("input_text", "output_text"),
            "reasoning": ("reasoning_text",), "function_call": PART_KINDS}
# The fields each item kind needs, besides its type.
REQUIRED = {"message": ("role", "content"), "function_call": ("call_id", "name", "arguments"),
            "function_call_output": ("call_id", "output"), "reasoning": ()}
FORMAT_TYPES = ("text", "json_object", "json_schema")
_MEDIA_PARTS = {"input_file": "file", "input_audio": "audio"}
STATELESS = "This server is stateless: send the whole conversation in `input`."
NO_STORED_PROMPTS = "This server keeps no stored prompts: send the prompt's text in `instructions` and `input`."


# ---- request schema: what pydantic cannot write from the types ------------------------------------

_NULLABLE_STRING = {"type": ["string", "null"]}
_PART_EXTRAS = {"text": _NULLABLE_STRING, "refusal": _NULLABLE_STRING, "annotations": {"type": ["array", "null"]},
                "logprobs": {"type": ["array", "null"]}}


def _parts_schema(kinds: tuple[str, ...], nullable: bool) -> dict[str, Any]:
    """Content as `ContentPart` reads it: parts of `kinds` (text, or refusal for a refusal), or a string
    where `input_text` is among them (a string is one such part)."""
    texts = [k for k in kinds if k not in ("refusal", "input_image")]
    parts = [{"type": "object", "required": ["type", "text"],
              "properties": {**_PART_EXTRAS, "type": {"enum": texts}, "text": {"type": "string"}}}]
    if "refusal" in kinds:
        parts.append({"type": "object", "required": ["type", "refusal"],
                      "properties": {**_PART_EXTRAS, "type": {"const": "refusal"}, "refusal": {"type": "string"}}})
    if "input_image" in kinds:  # documented only when the model takes images (server.openapi)
        parts.append({"type": "object", "required": ["type", "image_url"], VISION_ONLY: True, "properties": {
            **_PART_EXTRAS, "type": {"const": "input_image"}, "detail": {"description": "accepted and ignored"},
            "image_url": {"type": "string", "minLength": 1, "description": "http(s) URL or data:image/... URL"}}})
    branches: list[dict[str, Any]] = [{"type": "array", "items": {"anyOf": parts}}]
    if "input_text" in kinds:
        branches.insert(0, {"type": "string"})
    return {"anyOf": branches + ([{"type": "null"}] if nullable else [])}


def _item_schema(kind: str) -> dict[str, Any]:
    """One kind of `InputItem`: every field typed as the model reads it, its own fields required."""
    required = set(REQUIRED[kind])
    props: dict[str, Any] = {
        "type": {"enum": ["message", None]} if kind == "message" else {"const": kind},
        "role": {"enum": [*ROLES, *([] if "role" in required else [None])]},
        "content": _parts_schema(PARTS_OF[kind] if kind != "function_call_output" else PART_KINDS,
                                 nullable="content" not in required),
        "output": _parts_schema(PARTS_OF[kind] if kind == "function_call_output" else PART_KINDS,
                                nullable="output" not in required),
        **{name: {"type": "string"} if name in required else _NULLABLE_STRING
           for name in ("call_id", "name", "arguments", "id", "status", "encrypted_content")},
        "summary": {"type": ["array", "null"]},
    }
    schema = {"type": "object", "required": sorted(required | ({"type"} if kind != "message" else set())),
              "properties": props}
    if kind == "message":
        schema["allOf"] = [images_from_the_user_only("input_image")]
    return schema


def _document_request(schema: dict[str, Any]) -> None:
    """The rules pydantic cannot write from the types: the shapes of `input` and `tool_choice`, the forced
    call that needs tools, and that something must be there to answer."""
    props = schema["properties"]
    for branch in props["tools"].get("anyOf", []):  # a tool of another type is valid: it is ignored
        if branch.get("type") == "array":
            branch["items"] = {"anyOf": [branch["items"], OTHER_TOOL]}
    items = {"anyOf": [_item_schema(kind) for kind in ITEM_KINDS]}
    props["input"] = {"anyOf": [{"type": "string"}, {"type": "array", "items": items}, {"type": "null"}],
                      "description": "a user message, or the conversation as items"}
    props["tool_choice"]["anyOf"] = [
        {"enum": ["none", "auto", "required", None]},
        {"type": "object", "required": ["type", "name"], "additionalProperties": True,
         "description": "the function must be among `tools`",
         "properties": {"type": {"const": "function"}, "name": {"type": "string", "minLength": 1}}}]
    # Conditionals only (`if`/`then`), so that a policy's additionalProperties never applies to them.
    # Without instructions, an input item the model reads (a reasoning item is not replayed) must be there.
    read = {"type": "object", "not": {"required": ["type"], "properties": {"type": {"const": "reasoning"}}}}
    answerable = {"if": {"not": {"required": ["instructions"], "properties": {"instructions": {"type": "string"}}}},
                  "then": {"required": ["input"], "properties": {"input": {"anyOf": [
                      {"type": "string"}, {"type": "array", "contains": read}]}}}}
    # A forced call needs tools (the function it names must be among them: described, not a rule).
    forced = {"if": {"required": ["tool_choice"],
                     "properties": {"tool_choice": {"anyOf": [{"const": "required"}, {"type": "object"}]}}},
              "then": {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}}}
    schema["allOf"] = [answerable, forced]


def _document_tool(schema: dict[str, Any]) -> None:
    """A function tool's `type` is "function" (tools of other types are ignored: `_split_tools`)."""
    schema["properties"]["type"] = {"const": "function"}


# A tool of another type (hosted tools such as web_search, Codex's namespaces of tools): the server
# runs no tools and cannot route calls into a namespace, so such tools are left out of what the model
# is offered and reported as ignored (refused under --strict-params), rather than refusing clients
# that always send them.
OTHER_TOOL = {"type": "object", "required": ["type"], "additionalProperties": True, TOLERANT_ONLY: True,
              "properties": {"type": {"type": "string", "not": {"const": "function"}}},
              "description": "a tool of another type: ignored (reported in X-Dspark-Ignored; refused under "
                             "--strict-params)"}


def _document_format(schema: dict[str, Any]) -> None:
    """`text.format` as `TextConfig` checks it."""
    schema["properties"]["format"] = {"anyOf": [{"type": "null"}, {
        "type": "object", "required": ["type"], "additionalProperties": True,  # other keys: ignored, not reported
        "properties": {"type": {"enum": list(FORMAT_TYPES)}, "name": _NULLABLE_STRING,
                       "description": _NULLABLE_STRING, "strict": {"type": ["boolean", "null"]},
                       "schema": {"anyOf": [{"type": "object"}, {"const": True}]}}}],
        "description": 'as chat\'s response_format: {"type": "text"}, {"type": "json_object"} or '
                       '{"type": "json_schema", "name": ..., "schema": {...}, "strict": ...}'}


# ---- request ---------------------------------------------------------------------------------------


def _parts(value: Any) -> Any:
    """Content: a string (one text part), an array of parts, or null."""
    if isinstance(value, str):
        return [{"type": "input_text", "text": value}]
    if value is None or isinstance(value, list):
        return value
    raise PydanticCustomError("invalid_type", "Input should be a string or an array of content parts")


class ContentPart(BaseModel):
    """A text part of an input item (`input_text`, `output_text`, `reasoning_text`), a `refusal`, or an
    `input_image` by `image_url` (`detail` is ignored and reported; `file_id` is refused: no files kept)."""

    model_config = CONFIG
    type: Literal["input_text", "output_text", "refusal", "reasoning_text", "input_image"]
    text: str | None = None
    refusal: str | None = None
    image_url: str | None = Field(default=None, min_length=1)
    file_id: Annotated[str | None, WithJsonSchema({"type": "null"})] = None
    annotations: list[Any] | None = None  # replayed output text carries these; not read
    logprobs: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        """Name the media a text-only model cannot take, as the chat route does."""
        kind = data.get("type") if isinstance(data, dict) else None
        if isinstance(kind, str) and kind in _MEDIA_PARTS:
            raise PydanticCustomError(
                "unsupported_content_part",
                "Content part type '{kind}' is not supported: the served model reads text only ({what} input "
                "would be dropped). Send text parts.", {"kind": kind, "what": _MEDIA_PARTS[kind]})
        return data

    @model_validator(mode="after")
    def _has_text(self) -> ContentPart:
        """A refusal part carries `refusal`, an image part `image_url`, every other part `text`."""
        if self.type == "input_image" and self.file_id is not None:
            raise unsupported("file_id", "This server keeps no files: send the image as an 'image_url' (an http(s) "
                                         "or data: URL).")
        field = {"refusal": "refusal", "input_image": "image_url"}.get(self.type, "text")
        if getattr(self, field) is None:
            raise invalid(field, f"A '{self.type}' part needs '{field}' (a string).")
        return self

    @property
    def value(self) -> str:
        """The part's text."""
        return (self.refusal if self.type == "refusal" else self.text) or ""


Parts = Annotated[list[ContentPart] | None, BeforeValidator(_parts)]


class InputItem(BaseModel):
    """One item of `input`: a message (`type` may be left out), a function call the model made earlier,
    a function call's output, or earlier reasoning (read, not replayed to the model)."""

    model_config = CONFIG
    type: Literal["message", "function_call", "function_call_output", "reasoning"] | None = None
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: Parts = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: Parts = None
    # Replayed output items carry these; not read.
    id: str | None = None
    status: str | None = None
    summary: list[Any] | None = None
    encrypted_content: str | None = None

    @property
    def kind(self) -> str:
        """The item's type; a message when left out."""
        return self.type or "message"

    @model_validator(mode="after")
    def _complete(self) -> InputItem:
        """The fields its kind needs, and only the part types that kind reads."""
        kind = self.kind
        for name in REQUIRED[kind]:
            if getattr(self, name) is None:
                raise invalid(name, f"A {kind} item needs '{name}'.")
        parts = self.output if kind == "function_call_output" else self.content
        for j, part in enumerate(parts or []):
            if part.type not in PARTS_OF[kind]:
                where = "output" if kind == "function_call_output" else "content"
                raise invalid(where, f"'{where}[{j}]' of a {kind} item must be one of {', '.join(PARTS_OF[kind])} "
                                     f"parts, not '{part.type}'.")
        return self


def _items(value: Any) -> Any:
    """`input`: a string is one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if value is None or isinstance(value, list):
        return value
    raise PydanticCustomError("invalid_type", "Input should be a string or an array of input items")


class FunctionTool(BaseModel):
    """A function tool (the client runs it); tools of other types are ignored (`_split_tools`)."""

    model_config = ConfigDict(**CONFIG, json_schema_extra=_document_tool)
    type: str
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("type")
    @classmethod
    def _function_only(cls, value: str) -> str:
        if value != "function":  # `_split_tools` keeps other types out of `tools`
            raise PydanticCustomError("invalid_value", "A function tool's 'type' must be \"function\"")
        return value

    @staticmethod
    def ignored_as_a_whole(item: Any) -> bool:
        """A tool of another type is ignored as a whole (server/policy.py): reported, or refused under
        --strict-params."""
        return isinstance(item, dict) and isinstance(item.get("type"), str) and item["type"] != "function"


def _split_tools(data: Any) -> Any:
    """`data` without the tools that are not function tools (`FunctionTool.ignored_as_a_whole`)."""
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
        return data
    return {**data, "tools": [t for t in data["tools"] if not FunctionTool.ignored_as_a_whole(t)]}


def _tool_choice(value: Any) -> Any:
    """"none", "auto", "required" or a named function ({"type": "function", "name": ...})."""
    if value is None or value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str) \
            and value["name"]:
        return value
    raise invalid("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                 "{\"type\": \"function\", \"name\": ...}")


class StreamOptions(BaseModel):
    """`stream_options`: the stream is never obfuscated, so `include_obfuscation` changes nothing."""

    model_config = CONFIG
    include_obfuscation: bool | None = None


class ReasoningConfig(BaseModel):
    """`reasoning`: `effort` reaches the chat template as `reasoning_effort` ("none" turns thinking off)."""

    model_config = CONFIG
    effort: str | None = None


class TextConfig(BaseModel):
    """`text`: the output format (`format`), as chat's `response_format`."""

    model_config = ConfigDict(**CONFIG, json_schema_extra=_document_format)
    format: dict[str, Any] | None = None

    @field_validator("format")
    @classmethod
    def _format_shape(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """A known type; `schema` a JSON Schema object (or `true`); `name`, `description` strings; `strict` a boolean."""
        if value is None:
            return value
        if value.get("type") not in FORMAT_TYPES:
            raise invalid("text.format", "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"")
        checks = {"name": str, "description": str, "strict": bool}
        for key, kind in checks.items():
            if value.get(key) is not None and not isinstance(value[key], kind):
                raise invalid("text.format", f"'text.format.{key}' must be a {kind.__name__} or null")
        if "schema" in value and not (isinstance(value["schema"], dict) or value["schema"] is True):
            raise invalid("text.format", "'text.format.schema' must be a JSON Schema object")
        return value


Stateful = Annotated[Any, WithJsonSchema({"type": "null", "description": "only null: " + STATELESS})]


class ResponsesRequest(BaseModel):
    """POST /v1/responses body (stateless)."""

    model_config = ConfigDict(**CONFIG, json_schema_extra=_document_request)

    model: str | None = Field(default=None, description="default: the served model")
    input: Annotated[list[InputItem] | None, BeforeValidator(_items)] = None
    instructions: str | None = Field(default=None, description="a system message before `input`")
    tools: list[FunctionTool] | None = None
    tool_choice: Annotated[str | dict[str, Any] | None, BeforeValidator(_tool_choice)] = Field(
        default=None, description='"auto" (default), "none", "required" or {"type": "function", "name": ...}')
    parallel_tool_calls: bool | None = None
    max_output_tokens: Int | None = Field(default=None, ge=1, description=(
        "an upper bound (default: the rest of the context window); a reply that reaches the end of the window "
        "first ends there, incomplete"))
    temperature: float | None = Field(default=None, ge=0, le=2, description="default 1.0; 0 is greedy")
    top_p: float | None = Field(default=None, ge=0, le=1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    previous_response_id: Stateful = None
    conversation: Stateful = None
    prompt: Annotated[Any, WithJsonSchema({"type": "null", "description": "only null: " + NO_STORED_PROMPTS})] = None

    @model_validator(mode="before")
    @classmethod
    def _other_tools_apart(cls, data: Any) -> Any:
        """Tools of other types are kept out of `tools` (the policy reports them as ignored)."""
        return _split_tools(data)

    @field_validator("previous_response_id", "conversation", "prompt")
    @classmethod
    def _no_server_state(cls, value: Any, info: ValidationInfo) -> Any:
        """Only null: the server keeps no responses, conversations or prompts to refer to."""
        if value is not None:
            raise unsupported(info.field_name, NO_STORED_PROMPTS if info.field_name == "prompt" else STATELESS)
        return value

    @property
    def format(self) -> dict[str, Any] | None:
        """`text.format`, if sent."""
        return self.text.format if self.text else None


# ---- response -------------------------------------------------------------------------------------

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputText(BaseModel):
    """The text of an output message."""

    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    """The answer text (`status` "incomplete" when the token limit cut it)."""

    type: Literal["message"] = "message"
    id: str
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class ReasoningText(BaseModel):
    """The model's thinking, as it wrote it."""

    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(BaseModel):
    """What the model thought before answering (no summaries are made)."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]


class OutputFunctionCall(BaseModel):
    """A call of one of the request's functions; `arguments` is a JSON text."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


OutputItem = OutputMessage | OutputReasoning | OutputFunctionCall


class ResponseUsage(BaseModel):
    """Token counts (`cached_tokens`: prompt tokens restored from the prefix cache)."""

    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class ResponseObject(BaseModel):
    """The response (`object: "response"`); `dspark_stats` is the speculative-decoding extension, set once
    it finished. The request's settings are echoed as OpenAI does."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    error: None = None
    incomplete_details: dict[str, str] | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: None = None
    reasoning: dict[str, Any]
    store: bool = False
    temperature: float
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_p: float
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    dspark_stats: dict[str, Any] | None = Field(default=None, description="left out until the response finished")


# ---- response schemas -----------------------------------------------------------------------------

_INT = {"type": "integer", "minimum": 0}
_STRING = {"type": "string"}
# pydantic writes a bound it cannot place (on `Annotated[int, ...] | None`) under its own name.
_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def inline(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with each `$ref` to its `$defs` replaced by the definition (the models here do not recurse),
    and pydantic's bound names as JSON Schema's, so that validators enforce them."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(item) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = walk(copy.deepcopy(defs[ref.rsplit("/", 1)[1]]))
            return {**target, **{k: walk(v) for k, v in node.items() if k != "$ref"}}
        numeric = node.get("type") in ("integer", "number")
        # `discriminator`: an OpenAPI hint naming $defs; a null default: the OpenAPI document drops it anyway.
        return {_BOUNDS.get(k, k) if numeric else k: walk(v) for k, v in node.items()
                if k != "discriminator" and not (k == "default" and v is None)}

    return walk(schema)


def request_schema() -> dict[str, Any]:
    """The request body's JSON Schema."""
    return inline(ResponsesRequest.model_json_schema())


def response_schema() -> dict[str, Any]:
    """The response object's JSON Schema."""
    return inline(ResponseObject.model_json_schema(mode="serialization"))


def event_schema() -> dict[str, Any]:
    """One stream event's JSON Schema (each event's `type` names it; `sequence_number` counts from 0)."""
    item = inline(TypeAdapter(OutputItem).json_schema(mode="serialization"))
    part = {"anyOf": [inline(OutputText.model_json_schema(mode="serialization")),
                      inline(ReasoningText.model_json_schema(mode="serialization"))]}
    in_item = {"item_id": _STRING, "output_index": _INT}
    in_part = {**in_item, "content_index": _INT}
    logprobs = {"type": "array", "maxItems": 0}

    def event(names: list[str], **props: Any) -> dict[str, Any]:
        return {"type": "object", "required": ["type", "sequence_number", *props],
                "properties": {"type": {"enum": names}, "sequence_number": _INT, **props}}

    error = {"type": "object", "required": ["type", "sequence_number", "message"],
             "properties": {"type": {"const": "error"}, "sequence_number": _INT, "message": _STRING,
                            "code": _NULLABLE_STRING, "param": _NULLABLE_STRING}}
    return {"anyOf": [
        event(["response.created", "response.in_progress", "response.completed", "response.incomplete"],
              response=response_schema()),
        event(["response.output_item.added", "response.output_item.done"], output_index=_INT, item=item),
        event(["response.content_part.added", "response.content_part.done"], **in_part, part=part),
        event(["response.output_text.delta"], **in_part, delta=_STRING, logprobs=logprobs),
        event(["response.output_text.done"], **in_part, text=_STRING, logprobs=logprobs),
        event(["response.reasoning_text.delta"], **in_part, delta=_STRING),
        event(["response.reasoning_text.done"], **in_part, text=_STRING),
        event(["response.function_call_arguments.delta"], **in_item, delta=_STRING),
        event(["response.function_call_arguments.done"], **in_item, arguments=_STRING),
        error,
    ]}
