"""Pydantic shapes of the OpenAI API as this server speaks it: requests, responses, chunks, errors.

Request policy (server/README.md): types are strict (no "5" for an integer, no `true` for a
number, no NaN/Infinity), unknown fields are rejected with "Unrecognized request argument", and
OpenAI fields we do not implement are accepted only at their no-op value (`n: 1`, `tools: []`,
`logprobs: false`, ...) and otherwise rejected with a 400 naming the field. Extensions: `top_k`,
`min_p`, `chat_template_kwargs` (as in vLLM) and the `dspark` object (`{"sampler": ...}`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic_core import PydanticCustomError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STOP = 4

_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

# OpenAI request fields that this server does not implement and does not model at all: any value
# is refused (a no-op value of these does not exist or is never sent by default).
UNSUPPORTED_FIELDS = frozenset(
    {"audio", "modalities", "prediction", "reasoning_effort", "service_tier", "web_search_options",
     "verbosity", "metadata", "prompt_cache_key", "safety_identifier", "guided_json", "guided_regex"}
)


def unsupported(field: str, why: str = "") -> PydanticCustomError:
    """The error for an OpenAI feature this server rejects rather than ignores."""
    detail = f" {why}" if why else ""
    message = f"'{field}' is not supported by this server.{detail}"
    return PydanticCustomError("unsupported_parameter", message, {"param": field})


def _str_or_list(value: Any) -> Any:
    """`stop` may be one string or a list of strings."""
    if value is None or isinstance(value, list):
        return value
    if isinstance(value, str):
        return [value]
    raise PydanticCustomError("invalid_type", "Input should be a string or an array of strings")


def _content_parts(value: Any) -> Any:
    """Message content: a string, or an array of text parts."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if isinstance(value, list):
        return value
    raise PydanticCustomError("invalid_type", "Input should be a string or an array of content parts")


Stop = Annotated[
    Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP)] | None,
    BeforeValidator(_str_or_list),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP},
                              {"type": "null"}]}),
]


class TextPart(BaseModel):
    """A content part; only `{"type": "text", "text": ...}` is supported."""

    model_config = _STRICT
    type: Literal["text"]
    text: str

    @model_validator(mode="before")
    @classmethod
    def _only_text(cls, data: Any) -> Any:
        """Name the unsupported part type instead of listing every missing field."""
        if isinstance(data, dict) and isinstance(data.get("type"), str) and data["type"] != "text":
            raise PydanticCustomError(
                "unsupported_content_part",
                "Content part type '{kind}' is not supported; only 'text' parts are.",
                {"kind": data["type"]},
            )
        return data


Content = Annotated[
    list[TextPart],
    BeforeValidator(_content_parts),
    Field(min_length=1),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["type", "text"], "additionalProperties": False,
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]}),
]


class ChatMessage(BaseModel):
    """One conversation turn. `developer` is given to the chat template as `system`."""

    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[Any] | None = None

    @field_validator("tool_calls")
    @classmethod
    def _no_tool_calls(cls, value: list[Any] | None) -> list[Any] | None:
        """Tool calling is not implemented yet."""
        if value:
            raise unsupported("tool_calls", "Tool calling is not implemented yet.")
        return value

    def text(self) -> str:
        """The content as one string (text parts joined by newlines, as vLLM does)."""
        return "\n".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    """`stream_options`: only allowed with `stream: true`."""

    model_config = _STRICT
    include_usage: bool | None = None


class DsparkOptions(BaseModel):
    """The `dspark` request extension object."""

    model_config = _STRICT
    sampler: Literal["rejection", "seed-stable"] | None = Field(
        None, description="lossless sampler for this request; default: the server's --sampler"
    )


class GenerationFields(BaseModel):
    """Fields shared by chat and text completions."""

    model_config = _STRICT

    model: str
    max_tokens: int | None = Field(default=None, ge=1, description="default: the rest of the context window")
    temperature: float | None = Field(default=None, ge=0, le=2, description="default 1.0; 0 is greedy")
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, description="extension; 0 or -1: off")
    min_p: float | None = Field(default=None, ge=0, le=1, description="extension; 0: off")
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: Stop = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: int | None = Field(default=None, description="only 1")
    user: str | None = Field(default=None, description="accepted and ignored (informational only)")
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2, description="only 0")
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2, description="only 0")
    dspark: DsparkOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unmodelled(cls, data: Any) -> Any:
        """Known OpenAI fields we do not implement get a clearer error than 'unrecognized'."""
        if isinstance(data, dict):
            for key in sorted(UNSUPPORTED_FIELDS & data.keys()):
                if data[key] is not None:
                    raise unsupported(key)
        return data

    @field_validator("n")
    @classmethod
    def _single_choice(cls, value: int | None) -> int | None:
        """One choice per request (the engine serves one sequence)."""
        if value is not None and value != 1:
            raise unsupported("n", "Only n=1 is served; send separate requests.")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        """A bias would change the target distribution the lossless samplers promise."""
        if value:
            raise unsupported("logit_bias")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None, info: Any) -> float | None:
        """Penalties are not implemented; 0 (OpenAI's default) is accepted."""
        if value:
            raise unsupported(info.field_name, "Only 0 is accepted.")
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> GenerationFields:
        """OpenAI refuses `stream_options` unless `stream` is true."""
        if self.stream_options is not None and not self.stream:
            raise PydanticCustomError(
                "invalid_value", "'stream_options' is only allowed when 'stream' is true", {"param": "stream_options"}
            )
        return self

    @property
    def include_usage(self) -> bool:
        """Whether a final usage chunk was asked for."""
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(GenerationFields):
    """POST /v1/chat/completions body."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, description="same as max_tokens")
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="extension: template variables")
    logprobs: bool | None = Field(default=None, description="only false")
    top_logprobs: int | None = Field(default=None, description="not supported")
    response_format: dict[str, Any] | None = Field(default=None, description='only {"type": "text"}')
    tools: list[Any] | None = Field(default=None, description="not supported yet; only [] or null")
    tool_choice: Any = Field(default=None, description='only "none" or null')
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = Field(default=None, description="not supported; only [] or null")
    function_call: Any = Field(default=None, description='only "none" or null')
    store: bool | None = Field(default=None, description="only false")

    @field_validator("logprobs", "store")
    @classmethod
    def _false_only(cls, value: bool | None, info: Any) -> bool | None:
        """Accepted only when off."""
        if value:
            raise unsupported(info.field_name, "Only false is accepted.")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, value: int | None) -> int | None:
        """Log probabilities are not returned yet."""
        if value is not None:
            raise unsupported("top_logprobs")
        return value

    @field_validator("tools", "functions")
    @classmethod
    def _no_tools(cls, value: list[Any] | None, info: Any) -> list[Any] | None:
        """Tool calling is not implemented yet; an empty list asks for nothing."""
        if value:
            raise unsupported(info.field_name, "Tool calling is not implemented yet.")
        return value

    @field_validator("tool_choice", "function_call")
    @classmethod
    def _no_tool_choice(cls, value: Any, info: Any) -> Any:
        """Only the choice that calls no tool."""
        if value is not None and value != "none":
            raise unsupported(info.field_name, "Tool calling is not implemented yet.")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """Structured output is refused loudly rather than ignored."""
        if value is not None and value != {"type": "text"}:
            raise unsupported("response_format", 'Only {"type": "text"} is accepted.')
        return value

    @model_validator(mode="after")
    def _one_token_limit(self) -> ChatCompletionRequest:
        """`max_tokens` and `max_completion_tokens` must agree when both are sent."""
        a, b = self.max_tokens, self.max_completion_tokens
        if a is not None and b is not None and a != b:
            raise PydanticCustomError(
                "invalid_value", "'max_tokens' and 'max_completion_tokens' disagree; send one",
                {"param": "max_completion_tokens"},
            )
        return self

    @property
    def token_limit(self) -> int | None:
        """The requested completion length, if any."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def _prompt(value: Any) -> str | list[int]:
    """A completion prompt: a string, one-string list, token ids, or one token-id list."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(type(x) is int and x >= 0 for x in value):
        return value
    if isinstance(value, list) and len(value) > 1 and all(isinstance(x, str | list) for x in value):
        raise unsupported("prompt", "One prompt per request (a batch of prompts is not served).")
    raise PydanticCustomError(
        "invalid_type", "Input should be a string, an array of one string, or an array of token ids"
    )


Prompt = Annotated[
    str | list[int],
    BeforeValidator(_prompt),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 1},
                              {"type": "array", "items": {"type": "integer", "minimum": 0}}]}),
]


class CompletionRequest(GenerationFields):
    """POST /v1/completions body (legacy text completions)."""

    prompt: Prompt
    echo: bool | None = Field(default=None, description="only false")
    suffix: str | None = Field(default=None, description="not supported")
    best_of: int | None = Field(default=None, description="only 1")
    logprobs: int | None = Field(default=None, description="not supported")

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool | None) -> bool | None:
        """Echoing the prompt is not implemented."""
        if value:
            raise unsupported("echo")
        return value

    @field_validator("suffix", "logprobs")
    @classmethod
    def _absent(cls, value: Any, info: Any) -> Any:
        """Not implemented; only null is accepted."""
        if value is not None:
            raise unsupported(info.field_name)
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


# ---- responses -------------------------------------------------------------------------------


class Usage(BaseModel):
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    """The generated message of a non-streaming chat completion."""

    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class ChatChoice(BaseModel):
    """The single choice of a chat completion."""

    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length"]


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


class ChunkDelta(BaseModel):
    """What one stream chunk adds to the message (None keys are left out on the wire, as OpenAI does)."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    """The single choice of a stream chunk."""

    index: int = 0
    delta: ChunkDelta
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


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


class CompletionChoice(BaseModel):
    """The single choice of a text completion or completion chunk."""

    index: int = 0
    text: str
    logprobs: None = None
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
