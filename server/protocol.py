"""Pydantic shapes of the OpenAI API as this server speaks it: requests, responses, chunks, errors.

Request policy (server/README.md "Request policy"): types are strict (no "5" for an integer, no
`true` for a number, no NaN/Infinity; an integral float such as `16.0` is the integer, as in JSON
Schema). By default the server is tolerant: fields it does not model are ignored (`server.policy`
lists them for the log, the metrics and the `X-Dspark-Ignored` header). With `--strict-params`
(validation context `{"strict_params": True}`) it answers as OpenAI does: unknown fields and more
than 4 stop strings get a 400. Either way a 400 stays for what would otherwise be served wrongly: `n > 1`,
audio input, image input to a model that does not take images (server/vision.py), audio output, and a `response_format` or tool schema the grammar engine cannot
enforce (server/structured.py).
Extensions: `top_k`, `min_p`, `repetition_penalty`, `chat_template_kwargs` (as in vLLM) and the
`dspark` object (`{"sampler": ...}`).
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, ValidationInfo, WithJsonSchema, create_model,
    field_validator, model_validator,
)
from pydantic_core import PydanticCustomError

from server.prompt import TEMPLATE_FLAGS

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STOP = 64  # Continue's FIM templates send 7-9; the matcher's cost grows with the count
OPENAI_MAX_STOP = 4  # what --strict-params enforces, as OpenAI does
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a bias value: [-100, 100]
# A `logit_bias` key: a token id in canonical decimal, below 2**63 (str.isdigit would take "²", and
# int() refuses very long digit strings); ids past the vocabulary are refused by the engine.
TOKEN_ID_KEY = re.compile(r"0|[1-9][0-9]{0,17}")

_CONFIG = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)
_INPUT_PARTS = {"image_url": "image", "input_image": "image", "image": "image", "input_audio": "audio",
                "audio_url": "audio", "file": "file", "video_url": "video"}


# Marks a schema branch that only the tolerant policy accepts (server.openapi drops it under --strict-params).
TOLERANT_ONLY = "x-tolerant-only"
# Marks a schema branch served only by a model that takes images (server.openapi drops it for other models).
VISION_ONLY = "x-vision-only"


def strict_params(info: ValidationInfo) -> bool:
    """True when the request is validated under --strict-params."""
    return bool(info.context and info.context.get("strict_params"))


def unsupported(field: str, why: str = "") -> PydanticCustomError:
    """The error for an OpenAI feature this server refuses rather than serve wrongly."""
    detail = f" {why}" if why else ""
    message = f"'{field}' is not supported by this server.{detail}"
    return PydanticCustomError("unsupported_parameter", message, {"param": field})


def invalid(field: str, message: str) -> PydanticCustomError:
    """A 400 invalid_value naming `field`."""
    return PydanticCustomError("invalid_value", message, {"param": field})


def _integral(value: Any) -> Any:
    """`16.0` for an integer field is 16: JSON Schema's `integer` takes it, whatever the policy (and many
    scripts compute token counts as floats)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]


def _str_or_list(value: Any) -> Any:
    """`stop` may be one string or a list of strings."""
    if value is None or isinstance(value, list):
        return value
    if isinstance(value, str):
        return [value]
    raise PydanticCustomError("invalid_type", "Input should be a string or an array of strings")


def _content_parts(value: Any) -> Any:
    """Message content: a string, an array of parts, or null (an empty message)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "text", "text": value}] if value else []
    if isinstance(value, list):
        return value
    raise PydanticCustomError("invalid_type", "Input should be a string, an array of content parts or null")


Stop = Annotated[
    list[Annotated[str, Field(min_length=1)]] | None,
    BeforeValidator(_str_or_list),
    WithJsonSchema({"anyOf": [{"type": "string", "minLength": 1},
                              {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": MAX_STOP},
                              {"type": "null"}],
                    "description": f"up to {MAX_STOP} non-empty strings ({OPENAI_MAX_STOP} under --strict-params)"}),
]


def _scalar(value: Any) -> Any:
    """A template flag: a JSON scalar (no object or array for Jinja to walk), finite if a number."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PydanticCustomError("finite_number", "Input should be a finite number")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise PydanticCustomError("invalid_type", "Input should be a boolean, a number, a string or null")


TemplateFlag = Annotated[
    Any, BeforeValidator(_scalar), WithJsonSchema({"type": ["boolean", "number", "string", "null"]}),
]

ChatTemplateKwargs = create_model(
    "ChatTemplateKwargs",
    __config__=_CONFIG,
    __doc__="`chat_template_kwargs`: the switches a chat template may read (server.prompt.TEMPLATE_FLAGS). "
            "Other keys are ignored and reported (--strict-params: refused); null means unset.",
    **{flag: (TemplateFlag, None) for flag in TEMPLATE_FLAGS},
)


class TextPart(BaseModel):
    """A content part: text (and `refusal` in assistant history, read as text)."""

    model_config = _CONFIG
    type: Literal["text"]
    text: str
    refusal: str | None = Field(default=None, exclude=True, description="a `refusal` part's text, read as text")

    @model_validator(mode="before")
    @classmethod
    def _only_text(cls, data: Any) -> Any:
        """Read Responses-style text and refusal parts as text; name a part type that is not served."""
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            return data
        kind = data["type"]
        if kind in ("input_text", "output_text"):  # Responses-style text parts some clients send
            return {"type": "text", "text": data.get("text")}
        if kind == "refusal":
            return {"type": "text", "text": data.get("refusal")}
        if kind in ("input_image", "image"):
            raise PydanticCustomError(
                "unsupported_content_part",
                "Content part type '{kind}' is not supported in chat messages: send an image as an 'image_url' "
                "part (for a vision model).", {"kind": kind})
        if kind != "text":
            what = _INPUT_PARTS.get(kind, kind)
            raise PydanticCustomError(
                "unsupported_content_part",
                "Content part type '{kind}' is not supported: the server takes text parts, and image_url parts "
                "for a vision model ({what} input would be dropped).",
                {"kind": kind, "what": what},
            )
        return data


class ImageURL(BaseModel):
    """`image_url` of an image part. `detail` is not read (the model's processor decides the resolution):
    it is ignored and reported (server/policy.py; accepted under --strict-params, as OpenAI's inert fields)."""

    model_config = _CONFIG
    url: str = Field(min_length=1, description="an http(s) URL the server fetches, or a data:image/...;base64 URL")


class ImagePart(BaseModel):
    """A content part: an image, for a vision model (server/images.py fetches and checks it)."""

    model_config = _CONFIG
    type: Literal["image_url"]
    image_url: ImageURL

    @model_validator(mode="before")
    @classmethod
    def _legacy_url(cls, data: Any) -> Any:
        """`"image_url": "<url>"`, the undocumented string form OpenAI also takes, is `{"url": "<url>"}`."""
        if isinstance(data, dict) and isinstance(data.get("image_url"), str):
            return {**data, "image_url": {"url": data["image_url"]}}
        return data


def _part_kind(data: Any) -> str:
    """Which model reads a content part: the image model for `image_url` parts, the text model otherwise
    (it names the types that are not served)."""
    kind = data.get("type") if isinstance(data, dict) else getattr(data, "type", None)
    return "<image>" if kind == "image_url" else "<text>"


# Tags in angle brackets: error locations leave them out (server.body.param_name), so errors name the part.
Part = Annotated[Annotated[TextPart, Tag("<text>")] | Annotated[ImagePart, Tag("<image>")], Discriminator(_part_kind)]
_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"enum": ["text", "input_text", "output_text"]}, "text": {"type": "string"}}}
_REFUSAL_PART = {"type": "object", "required": ["type", "refusal"],
                 "properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}}}
_IMAGE_URL = {"type": "object", "required": ["url"], "properties": {
    "url": {"type": "string", "minLength": 1, "description": "http(s) URL, or data:image/<type>;base64,..."},
    "detail": {"description": "accepted and ignored"}}}
# Documented only when the served model takes images (server.openapi drops it otherwise).
_IMAGE_PART = {"type": "object", "required": ["type", "image_url"], VISION_ONLY: True,
               "properties": {"type": {"const": "image_url"}, "image_url": {"anyOf": [
                   _IMAGE_URL, {"type": "string", "minLength": 1}]}}}
Content = Annotated[
    list[Part],
    BeforeValidator(_content_parts),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "null"},
                              {"type": "array", "items": {"anyOf": [_TEXT_PART, _REFUSAL_PART, _IMAGE_PART]}}]}),
]


class FunctionCall(BaseModel):
    """`function` of an assistant tool call in history; `arguments` is a JSON string (an object is re-encoded)."""

    model_config = _CONFIG
    name: str
    arguments: Annotated[str, WithJsonSchema({"anyOf": [
        {"type": "string"}, {"type": "object", TOLERANT_ONLY: True}, {"type": "null"}]})] = "{}"

    @field_validator("arguments", mode="before")
    @classmethod
    def _as_json_text(cls, value: Any, info: ValidationInfo) -> Any:
        """Some clients send the arguments object itself; OpenAI's wire format is its JSON text."""
        if isinstance(value, dict) and not strict_params(info):
            return json.dumps(value, ensure_ascii=False)
        return "{}" if value is None else value


class ToolCall(BaseModel):
    """One tool call of an assistant message in history."""

    model_config = _CONFIG
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


def images_from_the_user_only(part_type: str) -> dict[str, Any]:
    """The schema rule of `_images_from_the_user`: a message whose role is not user holds no `part_type` part."""
    image = {"type": "object", "required": ["type"], "properties": {"type": {"const": part_type}}}
    return {"if": {"required": ["role"], "properties": {"role": {"not": {"const": "user"}}}},
            "then": {"properties": {"content": {"not": {"type": "array", "contains": image}}}}}


def _content_required_unless_assistant(schema: dict[str, Any]) -> None:
    """The schema's form of `_assistant_may_omit_content` and `_images_from_the_user`."""
    schema["required"] = [name for name in schema.get("required", []) if name != "content"]
    schema["if"] = {"properties": {"role": {"not": {"const": "assistant"}}}}
    schema["then"] = {"required": ["content"]}
    schema["allOf"] = [images_from_the_user_only("image_url")]


class ChatMessage(BaseModel):
    """One conversation turn. `developer` is given to the chat template as `system`."""

    model_config = ConfigDict(**_CONFIG, json_schema_extra=_content_required_unless_assistant)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Content
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = Field(default=None, description="earlier reasoning; given to the template")
    reasoning: str | None = Field(default=None, description="alias of reasoning_content (vLLM's name)")

    @model_validator(mode="after")
    def _images_from_the_user(self) -> ChatMessage:
        """Images come in user turns only (as in OpenAI's API; chat templates place them there)."""
        if self.role != "user" and self.has_images:
            raise invalid("content", f"Image parts are accepted in user messages only, not in a '{self.role}' message.")
        return self

    @model_validator(mode="before")
    @classmethod
    def _assistant_may_omit_content(cls, data: Any) -> Any:
        """An assistant turn may carry only tool calls (content absent or null); other roles need content."""
        if isinstance(data, dict) and data.get("role") == "assistant" and "content" not in data:
            return {**data, "content": None}
        return data

    def text(self) -> str:
        """The text of the content as one string (text parts joined by newlines, as vLLM does; images left out)."""
        return "\n".join(part.text for part in self.content if isinstance(part, TextPart))

    @property
    def has_images(self) -> bool:
        """Whether the content holds image parts."""
        return any(isinstance(part, ImagePart) for part in self.content)

    @property
    def reasoning_text(self) -> str | None:
        """Reasoning of an earlier assistant turn, under either name."""
        return self.reasoning_content if self.reasoning_content is not None else self.reasoning


class FunctionDef(BaseModel):
    """A callable function offered to the model."""

    model_config = _CONFIG
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    """One entry of `tools`; only function tools exist in the chat API."""

    model_config = _CONFIG
    type: Literal["function"] = "function"
    function: FunctionDef

    def template_dict(self) -> dict[str, Any]:
        """The OpenAI shape chat templates expect (`{"type": "function", "function": {...}}`)."""
        return {"type": "function", "function": self.function.model_dump(exclude_none=True)}


class StreamOptions(BaseModel):
    """`stream_options`: only allowed with `stream: true`."""

    model_config = _CONFIG
    include_usage: bool | None = None


class DsparkOptions(BaseModel):
    """The `dspark` request extension object."""

    model_config = _CONFIG
    sampler: Literal["rejection", "seed-stable"] | None = Field(
        None, description="lossless sampler for this request; default: the server's --sampler"
    )
    token_origins: bool | None = Field(
        None, description="each chunk (and a non-streamed reply) carries `dspark_tokens`: every generated token's "
                          "id, text and origin, \"draft\" (an accepted draft) or \"target\" (the target's own)")
    baseline: bool | None = Field(
        None, description="decode this request without drafts (plain target steps), whatever the server's mode")


def _stream_options_rule(schema: dict[str, Any]) -> None:
    """The schema's form of `_stream_options_need_stream`: an object `stream_options` needs `stream: true`."""
    schema["if"] = {"properties": {"stream_options": {"type": "object"}}, "required": ["stream_options"]}
    schema["then"] = {"properties": {"stream": {"const": True}}, "required": ["stream"]}


# `response_format`: text and json_object take nothing else; json_schema needs its `json_schema` object,
# whose `schema` is a JSON Schema (object or boolean). Whether the grammar engine can enforce that
# schema is not a JSON Schema rule: a schema it cannot is refused with a 400 naming the keyword.
RESPONSE_FORMAT_SCHEMA = {"anyOf": [
    {"type": "object", "properties": {"type": {"enum": ["text", "json_object"]}}, "required": ["type"],
     "additionalProperties": True},
    {"type": "object", "properties": {"type": {"const": "json_schema"}, "json_schema": {
        "type": "object", "properties": {"schema": {"type": ["object", "boolean"]}}, "additionalProperties": True}},
     "required": ["type", "json_schema"], "additionalProperties": True},
    {"type": "null"}]}


class GenerationFields(BaseModel):
    """Fields shared by chat and text completions."""

    model_config = ConfigDict(**_CONFIG, json_schema_extra=_stream_options_rule)

    model: str | None = Field(default=None, description="default: the served model")
    max_tokens: Int | None = Field(default=None, ge=1, description="default: the rest of the context window")
    temperature: float | None = Field(default=None, ge=0, le=2, description="default 1.0; 0 is greedy")
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: Int | None = Field(default=None, ge=-1, description="extension; 0 or -1: off")
    min_p: float | None = Field(default=None, ge=0, le=1, description="extension; 0: off")
    seed: Int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: Stop = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: Annotated[Int | None, WithJsonSchema({"enum": [1, None]})] = Field(default=None, description="only 1")
    logit_bias: dict[str, Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]] | None = Field(
        default=None, description="token id (decimal digits, below the vocabulary size) -> bias in [-100, 100]")
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, description="extension (vLLM); 1: off")
    response_format: Annotated[dict[str, Any] | None, WithJsonSchema(RESPONSE_FORMAT_SCHEMA)] = Field(
        default=None, description='{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
                                  '"json_schema": {"name": ..., "schema": {...}, "strict": ...}}')
    dspark: DsparkOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stop_count(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        """Up to MAX_STOP strings (OpenAI's 4 under --strict-params)."""
        limit = OPENAI_MAX_STOP if strict_params(info) else MAX_STOP
        if value is not None and len(value) > limit:
            raise invalid("stop", f"'stop' takes at most {limit} strings, got {len(value)}")
        return value

    @field_validator("n")
    @classmethod
    def _single_choice(cls, value: int | None) -> int | None:
        """One choice per request (the engine serves one sequence)."""
        if value is not None and value != 1:
            raise unsupported("n", "Only n=1 is served; send separate requests.")
        return value

    @field_validator("response_format")
    @classmethod
    def _format_shape(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """A known type; for json_schema, an object holding the schema as an object."""
        if value is None:
            return value
        kind = value.get("type")
        if kind not in ("text", "json_object", "json_schema"):
            raise invalid("response_format", "'response_format.type' must be \"text\", \"json_object\" or "
                                             "\"json_schema\"")
        if kind == "json_schema":
            spec = value.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict | bool):
                raise invalid("response_format", "'response_format.json_schema' must be an object whose 'schema' is "
                                                 "a JSON Schema object")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        """Keys are token ids as decimal strings (JSON's only key type); values are range-checked by type."""
        for key in value or {}:
            if not TOKEN_ID_KEY.fullmatch(key):
                raise invalid("logit_bias", f"'logit_bias' keys must be token ids, got {key[:40]!r}")
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> GenerationFields:  # the schema says it too: _stream_options_rule
        """OpenAI refuses `stream_options` unless `stream` is true."""
        if self.stream_options is not None and not self.stream:
            raise invalid("stream_options", "'stream_options' is only allowed when 'stream' is true")
        return self

    @property
    def include_usage(self) -> bool:
        """Whether a final usage chunk was asked for."""
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def bias_by_id(self) -> dict[int, float]:
        """`logit_bias` with integer token ids."""
        return {int(k): v for k, v in (self.logit_bias or {}).items()}


def forced_name(choice: dict[str, Any]) -> str | None:
    """The function a `tool_choice` object ({"type": "function", "function": {"name": ...}}) or a legacy
    `function_call` object ({"name": ...}) names; None if it is neither."""
    if "function" in choice or "type" in choice:
        inner = choice.get("function")
        if choice.get("type", "function") != "function" or not isinstance(inner, dict):
            return None
    else:
        inner = choice
    name = inner.get("name")
    return name if isinstance(name, str) and name else None


_NAME = {"type": "string", "minLength": 1}
# Other keys in these objects are ignored in either policy (the server reads only the name).
_NAMED_TOOL = {"type": "object", "properties": {"type": {"const": "function"}, "function": {
    "type": "object", "properties": {"name": _NAME}, "required": ["name"], "additionalProperties": True}},
    "required": ["function"], "additionalProperties": True}
_NAMED_FUNCTION = {"type": "object", "properties": {"name": _NAME}, "required": ["name"], "additionalProperties": True}
ToolChoice = Annotated[Literal["none", "auto", "required"] | dict[str, Any] | None,
                      WithJsonSchema({"anyOf": [{"enum": ["none", "auto", "required", None]}, _NAMED_TOOL]})]
LegacyFunctionCall = Annotated[Literal["none", "auto"] | dict[str, Any] | None,
                               WithJsonSchema({"anyOf": [{"enum": ["none", "auto", None]}, _NAMED_FUNCTION]})]


class ChatCompletionRequest(GenerationFields):
    """POST /v1/chat/completions body."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(
        default=None, ge=1, description="same as max_tokens; when both are sent they must be equal")
    chat_template_kwargs: ChatTemplateKwargs | None = Field(  # type: ignore[valid-type]
        default=None, description="extension: switches for the model's chat template (JSON scalars)")
    logprobs: bool | None = None
    top_logprobs: Int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice = Field(
        default=None, description='"auto", "none", "required" or {"type": "function", "function": {"name": ...}}')
    parallel_tool_calls: bool | None = None
    functions: list[FunctionDef] | None = Field(default=None, description="legacy form of tools")
    function_call: LegacyFunctionCall = Field(default=None, description="legacy form of tool_choice")
    reasoning_effort: str | None = Field(default=None, description='"none" turns thinking off; others go to the template')
    modalities: Annotated[list[str] | None, WithJsonSchema({"anyOf": [
        {"type": "array", "items": {"enum": ["text"]}}, {"type": "null"}]})] = Field(
        default=None, description='only ["text"]')
    audio: Annotated[dict[str, Any] | None, WithJsonSchema({"type": "null"})] = Field(
        default=None, description="not supported (text output only)")

    @field_validator("tool_choice", "function_call", mode="before")
    @classmethod
    def _choice_shape(cls, value: Any, info: ValidationInfo) -> Any:
        """Accept "none", "auto", "required" (tool_choice only) or a named function."""
        if value in (None, "none", "auto") or (value == "required" and info.field_name == "tool_choice"):
            return value
        if isinstance(value, dict) and forced_name(value) is not None:
            return value
        if info.field_name == "tool_choice":
            allowed = '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
        else:
            allowed = '"none", "auto" or {"name": ...}'
        raise invalid(info.field_name, f"'{info.field_name}' must be {allowed}")

    @field_validator("modalities")
    @classmethod
    def _text_out(cls, value: list[str] | None) -> list[str] | None:
        """Audio output cannot be produced."""
        if value and any(m != "text" for m in value):
            raise unsupported("modalities", 'Only ["text"] output is served.')
        return value

    @field_validator("audio")
    @classmethod
    def _no_audio(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """Audio output cannot be produced."""
        if value is not None:
            raise unsupported("audio", "Only text output is served.")
        return value

    @model_validator(mode="after")
    def _forced_call_has_its_tool(self) -> ChatCompletionRequest:
        """A forced call needs tools, and a named one must be among them."""
        field = self.forced_tool_field
        choice = self.forced_tool_choice
        if choice is None:
            return self
        names = [t.function.name for t in self.tool_defs]
        if not names:
            raise invalid(field, f"'{field}' forces a tool call, but the request offers no tools")
        if choice != "required" and choice not in names:
            raise invalid(field, f"'{field}' names the function {choice!r}, which is not among the tools offered")
        return self

    @model_validator(mode="after")
    def _one_token_limit(self) -> ChatCompletionRequest:
        """`max_tokens` and `max_completion_tokens` must agree when both are sent."""
        a, b = self.max_tokens, self.max_completion_tokens
        if a is not None and b is not None and a != b:
            raise invalid("max_completion_tokens", "'max_tokens' and 'max_completion_tokens' disagree; send one")
        return self

    @property
    def token_limit(self) -> int | None:
        """The requested completion length, if any."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def tool_defs(self) -> list[ToolDef]:
        """The tools offered to the model (`functions` is the legacy spelling); none when choice is "none"."""
        if self.tool_choice == "none" or self.function_call == "none":
            return []
        return list(self.tools or []) + [ToolDef(function=f) for f in self.functions or []]

    @property
    def forced_tool_choice(self) -> str | None:
        """The forced call: "required", the name of the function every answer must call, or None."""
        for choice in (self.tool_choice, self.function_call):
            if choice == "required":
                return choice
            if isinstance(choice, dict):
                return forced_name(choice)
        return None

    @property
    def forced_tool_field(self) -> str:
        """The field that forces the call (`tool_choice`, else the legacy `function_call`), for errors."""
        return "tool_choice" if self.tool_choice not in (None, "none", "auto") else "function_call"

    @property
    def num_logprobs(self) -> int | None:
        """Alternatives per token when logprobs were asked for (None: off)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def max_tool_calls(self) -> int | None:
        """1 with `parallel_tool_calls: false`, else no limit."""
        return 1 if self.parallel_tool_calls is False else None


def _prompt(value: Any) -> str | list[int]:
    """A completion prompt: a string, one-string list, token ids, or one token-id list."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(_token_id(x) for x in value):
        return [int(x) for x in value]
    if value == "" or value == []:
        raise invalid("prompt", "'prompt' is empty: send at least one character or token id")
    if isinstance(value, list) and len(value) > 1 and all(isinstance(x, str | list) for x in value):
        raise unsupported("prompt", "One prompt per request (a batch of prompts is not served).")
    raise PydanticCustomError(
        "invalid_type", "Input should be a string, an array of one string, or an array of token ids"
    )


_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
def _token_id(value: Any) -> bool:
    """A token id: a non-negative integer (an integral float is one too; a boolean is not)."""
    integral = type(value) is int or (type(value) is float and value.is_integer())
    return integral and value >= 0


Prompt = Annotated[
    str | list[int],
    BeforeValidator(_prompt),
    WithJsonSchema({"anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1},
        _TOKEN_IDS,
        {"type": "array", "items": _TOKEN_IDS, "minItems": 1, "maxItems": 1},
    ], "description": "text, one text in an array, token ids (below the vocabulary size), or one list of them"}),
]


class CompletionRequest(GenerationFields):
    """POST /v1/completions body (legacy text completions)."""

    prompt: Prompt
    echo: Annotated[bool | None, WithJsonSchema({"enum": [False, None]})] = Field(default=None, description="only false")
    suffix: Annotated[str | None, WithJsonSchema({"type": "null"})] = Field(default=None, description="not supported")
    best_of: Annotated[Int | None, WithJsonSchema({"enum": [1, None]})] = Field(default=None, description="only 1")
    logprobs: Int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS, description="alternatives per token")

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool | None) -> bool | None:
        """Echoing the prompt is not implemented."""
        if value:
            raise unsupported("echo")
        return value

    @field_validator("suffix")
    @classmethod
    def _absent(cls, value: Any, info: ValidationInfo) -> Any:
        """Fill-in-the-middle is not served; only null is accepted."""
        if value is not None:
            raise unsupported(info.field_name, "Fill-in-the-middle is not served; render the FIM prompt yourself.")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_one(cls, value: int | None) -> int | None:
        """One candidate per request."""
        if value is not None and value != 1:
            raise unsupported("best_of", "Only best_of=1 is served.")
        return value

    @property
    def token_limit(self) -> int | None:
        """The requested completion length, if any."""
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """Alternatives per token when logprobs were asked for (None: off)."""
        return self.logprobs


# ---- responses -------------------------------------------------------------------------------


class Usage(BaseModel):
    """Token counts of one request (`*_details` as OpenAI sends them; no prompt cache yet, so 0 cached)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None
    completion_tokens_details: dict[str, int] | None = None


FinishReason = Literal["stop", "length", "tool_calls"]


class AssistantMessage(BaseModel):
    """The generated message of a non-streaming chat completion (content is null when only tools are called)."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    reasoning_content: str | None = None  # left out of the JSON when None
    tool_calls: list[dict[str, Any]] | None = None  # left out of the JSON when None


class ChatChoice(BaseModel):
    """The single choice of a chat completion."""

    index: int = 0
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: FinishReason


class TokenOrigin(BaseModel):
    """One generated token under `dspark.token_origins`: its id, its text decoded alone (special tokens
    kept, so the end-of-sequence token has text too) and whether it was an accepted draft or the target's."""

    id: int
    text: str
    origin: Literal["draft", "target"]


class ChatCompletionResponse(BaseModel):
    """Non-streaming chat completion; `dspark_stats` is the speculative-decoding extension."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: Usage
    dspark_stats: dict[str, Any] | None = None
    dspark_tokens: list[TokenOrigin] | None = None


class ChunkDelta(BaseModel):
    """What one stream chunk adds to the message (None keys are left out on the wire, as OpenAI does)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChunkChoice(BaseModel):
    """The single choice of a stream chunk."""

    index: int = 0
    delta: ChunkDelta
    logprobs: dict[str, Any] | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    """One `data:` event of a streamed chat completion (`choices` is empty on the usage chunk)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    dspark_stats: dict[str, Any] | None = None
    dspark_tokens: list[TokenOrigin] | None = None


class CompletionChoice(BaseModel):
    """The single choice of a text completion or completion chunk."""

    index: int = 0
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: Literal["stop", "length"] | None = None


class CompletionResponse(BaseModel):
    """Text completion, non-streaming, or one chunk of a stream (same object type, as in OpenAI)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: Usage | None = None
    dspark_stats: dict[str, Any] | None = None
    dspark_tokens: list[TokenOrigin] | None = None


class ErrorDetail(BaseModel):
    """The body of every error."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error envelope."""

    error: ErrorDetail


class ModelCard(BaseModel):
    """One served model; `dspark` says how it is decoded."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "dspark-serve"
    dspark: dict[str, Any]


class ModelList(BaseModel):
    """GET /v1/models."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class LookupHistoryHealth(BaseModel):
    """What the cross-request lookup history holds (`--lookup-history`): its memory, reported."""

    budget_tokens: int
    tokens: int
    approx_bytes: int


class PrefixCacheHealth(BaseModel):
    """What the prefix cache holds (`--prefix-cache-mb`) and how many prompt tokens it saved."""

    budget_bytes: int
    bytes: int
    entries: int
    tokens: int  # positions held, over all entries
    hit_tokens: int  # prompt tokens restored instead of prefilled, since start
    miss_tokens: int  # prompt tokens prefilled, since start
    evictions: int


class Health(BaseModel):
    """GET /health: 200 only when the engine is ready and the server is not draining."""

    status: Literal["ok", "loading", "dead", "draining"]
    state: Literal["loading", "ready", "dead"]
    model: str | None
    mode: str
    drafter: str | None
    cap: int | None
    sampler: str
    context_length: int | None
    queue_depth: int
    max_queue: int
    draining: bool
    dead_reason: str | None = None
    requested_mode: str | None = None  # set when the served mode differs from the requested one
    mode_note: str | None = None  # why (e.g. no drafter is known for the target)
    drafter_kind: str | None = None  # what proposes the drafts: dspark, dflash or lookup (None: baseline)
    draft_vocab: int | None = None  # the trained drafter's shortlist size (None: the whole vocabulary)
    lookup_history: LookupHistoryHealth | None = None  # set when --lookup-history is on
    prefix_cache: PrefixCacheHealth | None = None  # set when the prefix cache is on

