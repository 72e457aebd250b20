"""A Responses request as the chat completion request that generates it, and the chat pipeline's errors
in the Responses request's field names.

`instructions` is a system message first. Input messages keep their role (`developer` as in chat);
consecutive `function_call` items (and an assistant message just before them) make one assistant
message with several `tool_calls`, and a `function_call_output` is a `tool` message answering its
`call_id`. Reasoning items are not replayed: a chat client would send none.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from server.body import from_validation_error
from server.errors import APIError
from server.protocol import ChatCompletionRequest
from server.responses.protocol import ContentPart, ResponsesRequest

# A chat field -> the Responses field it was made from.
FIELDS = {"messages": "input", "max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
          "response_format": "text.format", "reasoning_effort": "reasoning.effort"}
_MESSAGE = re.compile(r"messages\[(\d+)\]")


def chat_request(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat completion request for `body`; a 400 naming the Responses field if chat refuses it."""
    messages, origins = chat_messages(body)
    if not messages:
        raise APIError(400, "Nothing to answer: send `instructions`, or at least one message, function_call or "
                            "function_call_output item in `input`.", param="input", code="invalid_value")
    tools = [{"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
             for tool in body.tools or []]
    data = {
        "model": body.model, "messages": messages, "max_tokens": body.max_output_tokens,
        "temperature": body.temperature, "top_p": body.top_p, "stream": body.stream, "tools": tools or None,
        "tool_choice": tool_choice(body.tool_choice), "parallel_tool_calls": body.parallel_tool_calls,
        "reasoning_effort": body.reasoning.effort if body.reasoning else None,
        "response_format": response_format(body.format),
    }
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in data.items() if v is not None})
    except ValidationError as exc:
        raise renamed(from_validation_error(exc), origins) from None


def chat_messages(body: ResponsesRequest) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat messages of `instructions` and `input`, and the Responses field each one came from."""
    messages: list[dict[str, Any]] = []
    origins: list[str] = []
    if body.instructions is not None:
        messages.append({"role": "system", "content": body.instructions})
        origins.append("instructions")
    for i, item in enumerate(body.input or []):
        kind = item.kind
        if kind == "reasoning":
            continue
        if kind == "function_call":
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if messages and messages[-1]["role"] == "assistant":  # the same assistant turn
                messages[-1].setdefault("tool_calls", []).append(call)
                continue
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text_parts(item.output)})
        else:
            messages.append({"role": item.role, "content": _parts(item.content)})
        origins.append(f"input[{i}]")
    return messages, origins


def _text_parts(parts: list[ContentPart] | None) -> list[dict[str, str]]:
    """Chat text parts (a refusal replayed is read as text, as the chat route reads one)."""
    return [{"type": "text", "text": part.value} for part in parts or []]


def _parts(parts: list[ContentPart] | None) -> list[dict[str, Any]]:
    """Chat content parts: text as `_text_parts`, an `input_image` as an `image_url` part."""
    return [{"type": "image_url", "image_url": {"url": part.image_url}} if part.type == "input_image"
            else {"type": "text", "text": part.value} for part in parts or []]


def image_params(body: ResponsesRequest) -> list[tuple[str, str]]:
    """(part, URL field) of each `input_image`, in the order `chat_request` turns them into image parts."""
    return [(f"input[{i}].content[{j}]", f"input[{i}].content[{j}].image_url")
            for i, item in enumerate(body.input or []) if item.kind == "message"
            for j, part in enumerate(item.content or []) if part.type == "input_image"]


def tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """Chat's form: a named function is {"type": "function", "function": {"name": ...}}."""
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format` (json_schema's fields move under `json_schema`)."""
    if fmt is None or fmt["type"] != "json_schema":
        return None if fmt is None else {"type": fmt["type"]}
    keys = ("name", "description", "schema", "strict")
    return {"type": "json_schema", "json_schema": {k: fmt[k] for k in keys if fmt.get(k) is not None}}


def token_limit(limit: int | None, prompt_tokens: int, context_length: int) -> int | None:
    """`max_output_tokens` within what the context window leaves after the prompt.

    It is an upper bound, so a reply that reaches the end of the window first ends there, `incomplete`,
    rather than being refused (the window depends on the model; the documented schema cannot state it).
    """
    return None if limit is None else max(min(limit, context_length - prompt_tokens), 1)


def renamed(error: APIError, origins: Sequence[str] = ()) -> APIError:
    """`error` naming the Responses field where it names a chat one (`messages[2]` -> the input item it came
    from, given `origins`; `max_tokens` -> `max_output_tokens`, ...)."""
    param = error.param
    new = None if param is None else responses_field(param, origins)
    if new is None or new == param:
        return error
    message = error.message.replace(f"'{param}'", f"'{new}'")
    return APIError(error.status, message, type=error.type, param=new, code=error.code, headers=error.headers)


def responses_field(param: str, origins: Sequence[str] = ()) -> str:
    """The Responses field for a chat field path."""
    found = _MESSAGE.match(param)
    if found and int(found[1]) < len(origins):
        return origins[int(found[1])]
    head = re.split(r"[.\[]", param, maxsplit=1)[0]
    if head == "tools":
        return param.replace(".function.", ".", 1)
    return FIELDS[head] + param[len(head):] if head in FIELDS else param
