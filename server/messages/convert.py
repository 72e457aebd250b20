"""An Anthropic Messages request as the server's chat request, so it takes the chat path unchanged.

- `system` (a string or text blocks) becomes the first system message.
- A user turn's `tool_result` blocks become `tool` messages (in order, before the turn's text);
  its text blocks are joined with "\\n"; with `image` blocks (a base64 or url `source`, for a vision
  model) its text and images are chat content parts in their order (images as `image_url` parts,
  base64 as a data: URL). An assistant turn's `text` blocks are its content,
  `tool_use` blocks its `tool_calls` (arguments as JSON text), `thinking` blocks its reasoning.
- `tools` become function tools (`input_schema` is the parameters); `tool_choice` auto/any/tool/
  none become "auto"/"required"/a named function/"none"; `disable_parallel_tool_use` is
  `parallel_tool_calls: false`.
- `stop_sequences` are stop strings; `thinking` switches the template's thinking (off for
  "disabled"; `budget_tokens` is not enforced: the template decides how long the model thinks);
  `output_config.format` (a JSON schema) is the chat path's `response_format`.
- Documents, images outside a user turn's blocks and Anthropic's server tools are refused with a 400
  naming the block.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from server.body import from_validation_error
from server.errors import APIError
from server.messages.protocol import CountTokensRequest, MessageParam, MessagesRequest
from server.protocol import ChatCompletionRequest

IMAGE_MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")  # what Anthropic's API takes
_REFUSED_BLOCKS = {"document": "documents", "search_result": "search results",
                   "server_tool_use": "server tools", "web_search_tool_result": "server tools",
                   "container_upload": "files"}


def chat_request(req: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request that generates what `req` asks for (validated as a chat body)."""
    body: dict[str, Any] = {"model": req.model, "messages": _system(req.system) + _turns(req.messages)}
    body.update(_tools(req))
    body.update(_thinking(req))
    body.update(_output_format(req))
    if isinstance(req, MessagesRequest):
        body.update({"max_tokens": req.max_tokens, "temperature": req.temperature, "top_p": req.top_p,
                     "top_k": req.top_k, "stop": req.stop_sequences, "stream": req.stream})
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:  # a value that passed our shapes but not the chat path's rules
        raise from_validation_error(exc) from None


def _system(system: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if system is None:
        return []
    text = system if isinstance(system, str) else _joined_text(system, "system")
    return [{"role": "system", "content": text}] if text else []


def _turns(messages: list[MessageParam]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if isinstance(message.content, list) and not message.content:
            raise _invalid(f"messages[{i}].content", "A turn's content must be a string or a non-empty list of blocks")
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
        elif message.role == "user":
            out += _user_turn(message.content, f"messages[{i}].content")
        else:
            out.append(_assistant_turn(message.content, f"messages[{i}].content"))
    return out


def _user_turn(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Tool results as `tool` messages, then the text and images (if any) as one user message."""
    out, parts = [], []
    for j, block in enumerate(blocks):
        kind = _kind(block, f"{where}[{j}]")
        if kind == "tool_result":
            out.append({"role": "tool", "tool_call_id": _string(block, "tool_use_id", f"{where}[{j}]"),
                        "content": _tool_result_text(block, f"{where}[{j}]")})
        elif kind == "text":
            parts.append({"type": "text", "text": _string(block, "text", f"{where}[{j}]")})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, f"{where}[{j}].source")}})
        else:
            _unexpected(kind, f"{where}[{j}]", "a user turn")
    if any(part["type"] == "image_url" for part in parts):
        out.append({"role": "user", "content": parts})
    elif parts:
        out.append({"role": "user", "content": "\n".join(part["text"] for part in parts)})
    return out


def _image_url(block: dict[str, Any], where: str) -> str:
    """An image block's `source` as a URL: `base64` as a data: URL, `url` as it is."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if media_type not in IMAGE_MEDIA_TYPES or not isinstance(data, str):
            raise _invalid(where, f"A base64 '{where}' needs 'data' (a string) and a 'media_type' among "
                                  f"{', '.join(IMAGE_MEDIA_TYPES)}")
        return f"data:{media_type};base64,{data}"
    if kind == "url":
        if not isinstance(source.get("url"), str) or not source["url"]:
            raise _invalid(where, f"A url '{where}' needs a 'url' string")
        return source["url"]
    raise _invalid(where, f"'{where}' must be {{\"type\": \"base64\", \"media_type\", \"data\"}} or "
                          f"{{\"type\": \"url\", \"url\"}} (file sources are not served)")


def image_params(req: CountTokensRequest) -> list[tuple[str, str]]:
    """(block, source field) of each image block, in the order `chat_request` turns them into image parts."""
    return [(f"messages[{i}].content[{j}]", f"messages[{i}].content[{j}].source")
            for i, message in enumerate(req.messages) if message.role == "user" and isinstance(message.content, list)
            for j, block in enumerate(message.content) if isinstance(block, dict) and block.get("type") == "image"]


def _assistant_turn(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts, calls, thoughts = [], [], []
    for j, block in enumerate(blocks):
        kind, at = _kind(block, f"{where}[{j}]"), f"{where}[{j}]"
        if kind == "text":
            texts.append(_string(block, "text", at))
        elif kind == "tool_use":
            arguments = block.get("input", {})
            if not isinstance(arguments, dict):
                raise _invalid(f"{at}.input", "a tool_use block's 'input' must be an object")
            calls.append({"id": _string(block, "id", at), "type": "function",
                          "function": {"name": _string(block, "name", at), "arguments": json.dumps(arguments)}})
        elif kind == "thinking":
            thoughts.append(_string(block, "thinking", at))
        elif kind != "redacted_thinking":  # opaque to anything but Anthropic's own models: dropped
            _unexpected(kind, at, "an assistant turn")
    turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        turn["tool_calls"] = calls
    if thoughts:
        turn["reasoning_content"] = "".join(thoughts)
    return turn


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content", "")
    text = content if isinstance(content, str) else _joined_text(content, f"{where}.content")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise _invalid(f"{where}.is_error", f"'{where}.is_error' must be a boolean")
    return f"Error: {text}" if is_error else text


def _joined_text(blocks: Any, where: str) -> str:
    """The text of a list of text blocks, joined with "\\n"."""
    if not isinstance(blocks, list):
        raise _invalid(where, f"'{where}' must be a string or a list of text blocks")
    texts = []
    for j, block in enumerate(blocks):
        kind = _kind(block, f"{where}[{j}]")
        if kind != "text":
            _unexpected(kind, f"{where}[{j}]", "this place")
        texts.append(_string(block, "text", f"{where}[{j}]"))
    return "\n".join(texts)


def _tools(req: CountTokensRequest) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if req.tools:
        for i, tool in enumerate(req.tools):
            if tool.type not in (None, "custom"):
                raise APIError(400, f"Server tool '{tool.type}' is not served: only client tools (with an "
                                    "input_schema) are.", param=f"tools[{i}].type", code="unsupported_parameter")
        out["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                          "parameters": t.input_schema}} for t in req.tools]
    choice = req.tool_choice
    if choice is not None:
        if choice.type == "tool" and not choice.name:
            raise _invalid("tool_choice.name", "tool_choice of type 'tool' needs the tool's 'name'")
        named = {"type": "function", "function": {"name": choice.name}}
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none", "tool": named}[choice.type]
        if choice.disable_parallel_tool_use:
            out["parallel_tool_calls"] = False
    return out


def _thinking(req: CountTokensRequest) -> dict[str, Any]:
    if req.thinking is None:
        return {}
    if req.thinking.type == "disabled":
        return {"reasoning_effort": "none"}
    return {"chat_template_kwargs": {"enable_thinking": True}}


def _output_format(req: CountTokensRequest) -> dict[str, Any]:
    """`output_config.format` as the chat path's `response_format`."""
    fmt = req.output_config.format if req.output_config is not None else None
    if fmt is None:
        return {}
    if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise _invalid("output_config.format", "'output_config.format' must be {\"type\": \"json_schema\", "
                                               "\"schema\": {...}}")
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}}


def _kind(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise _invalid(where, f"'{where}' must be a content block object with a 'type'")
    return block["type"]


def _string(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise _invalid(f"{where}.{key}", f"'{where}.{key}' must be a string")
    return value


def _unexpected(kind: str, where: str, place: str) -> None:
    if kind == "image":
        raise APIError(400, f"Image blocks are served in a user turn's content only, not in {place}.", param=where,
                       code="unsupported_parameter")
    if kind in _REFUSED_BLOCKS:
        raise APIError(400, f"Content blocks of type '{kind}' are not served ({_REFUSED_BLOCKS[kind]} need a "
                            "model and features this server does not have).", param=where,
                       code="unsupported_parameter")
    raise _invalid(where, f"A '{kind}' block is not valid in {place}")


def _invalid(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")
