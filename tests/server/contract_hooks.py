"""Schemathesis hooks for the contract runs (`tests/server/test_contract.py`, `make contract`).

Generated bodies are sent as they are, except for rules JSON Schema cannot state, which a hook makes
hold without making an invalid body valid (each hook touches only values that are valid as they are):
- A completion is kept short: when every token limit a body sends is valid (a positive integer or
  null), all of them (`max_tokens`, and for chat `max_completion_tokens`) are set to the smallest one
  sent, at most `MAX_TOKENS`. So a run measures the contract, not the model's speed, and the two chat
  limits agree (the server refuses two different ones).
- A forced tool call names a tool the body offers: the name of a named choice becomes the first
  tool's; a forced choice in a body that offers no tool is dropped (chat, Messages).
- A JSON schema that a body asks the output to match (`response_format`, `output_config.format`,
  `text.format`, or a forced tool's parameters) becomes `{"type": "object"}`: whether the grammar
  engine can enforce a schema is not a JSON Schema rule (one it cannot is refused with a 400 naming
  the keyword, tests/server/test_errors.py).
- Against the real engine (`DSPARK_CONTRACT_MAX_CHARS` set by `test_contract.py`), a body generated
  as valid is made small: each string is cut to that many characters and each array to its first
  `MAX_ITEMS` items. A fuzzed prompt of thousands of tokens costs tens of seconds of CPU prefill and
  tests no more of the contract (the schema sets no maximum length and no minimum above 1). Bodies
  generated as invalid are sent as they are.
- An image URL (documented only when the served model takes images) becomes a data: URL of a small
  PNG: whether a URL can be fetched and holds an image is not a JSON Schema rule (tests/server/test_vision.py
  covers the refusals). Only non-empty strings are replaced, so an invalid part stays invalid. Image
  parts past the server's limit per request (a count across messages) become text parts.
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis

from server.vision import MAX_IMAGES

MAX_TOKENS = int(os.environ.get("DSPARK_CONTRACT_MAX_TOKENS", "4"))
MAX_CHARS = int(os.environ.get("DSPARK_CONTRACT_MAX_CHARS", "0"))  # 0: valid bodies as generated
MAX_ITEMS = 3  # with MAX_CHARS: arrays of valid bodies are cut to this many items
LIMITS = {"/v1/chat/completions": ("max_tokens", "max_completion_tokens"), "/v1/completions": ("max_tokens",),
          "/v1/messages": ("max_tokens",), "/v1/responses": ("max_output_tokens",)}
ANY_OBJECT = {"type": "object"}
# A 1x1 PNG.
PNG_B64 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")
PNG_URL = f"data:image/png;base64,{PNG_B64}"
IMAGE_PARTS = {"image_url": "text", "image": "text", "input_image": "input_text"}  # -> the API's text part


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """Cap the completion length and make the schema rules above hold (see the module docstring)."""
    if not isinstance(case.body, dict):
        return
    if MAX_CHARS and _generated_valid(case):
        _shorten(case.body)
    path = case.operation.path
    for fix in FIXES.get(path, ()):
        fix(case.body)
    names = LIMITS.get(path)
    if names is None:
        return
    sent = [case.body.get(name) for name in names]
    if not all(value is None or _positive_integer(value) for value in sent):
        return
    limit = min([int(value) for value in sent if value is not None] + [MAX_TOKENS])
    for name in names:
        case.body[name] = limit


def _generated_valid(case: Any) -> bool:
    """True for a case Schemathesis generated to match the schema (positive mode)."""
    mode = getattr(getattr(getattr(case, "meta", None), "generation", None), "mode", None)
    return getattr(mode, "value", mode) == "positive"


def _shorten(container: dict[str, Any] | list[Any]) -> None:
    """Cut every string inside `container` (keys excepted) to MAX_CHARS and every array to MAX_ITEMS
    items, in place."""
    if isinstance(container, list):
        del container[MAX_ITEMS:]
    keys = container.keys() if isinstance(container, dict) else range(len(container))
    for key in keys:
        value = container[key]
        if isinstance(value, str):
            container[key] = value[:MAX_CHARS]
        elif isinstance(value, dict | list):
            _shorten(value)


def _positive_integer(value: Any) -> bool:
    """What JSON Schema's `{"type": "integer", "minimum": 1}` takes: 3 and 3.0, not true or 3.5."""
    return type(value) in (int, float) and value >= 1 and float(value).is_integer()


def _chat_format(body: dict[str, Any]) -> None:
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("json_schema"), dict):
        if isinstance(fmt["json_schema"].get("schema"), dict | bool):
            fmt["json_schema"]["schema"] = dict(ANY_OBJECT)


def _chat_forced_call(body: dict[str, Any]) -> None:
    for choice_key, tools_key in (("tool_choice", "tools"), ("function_call", "functions")):
        choice = body.get(choice_key)
        if not (choice == "required" or isinstance(choice, dict)):
            continue
        functions = [t.get("function") if tools_key == "tools" else t for t in _list(body.get(tools_key))]
        names = [f.get("name") for f in functions if isinstance(f, dict)]
        if not names:
            body[choice_key] = None
            continue
        _plain_parameters(functions, "parameters")
        named = choice.get("function") if isinstance(choice, dict) and isinstance(choice.get("function"), dict) \
            else choice
        if isinstance(named, dict) and _name(named.get("name")) and _name(names[0]):
            named["name"] = names[0]


def _messages(body: dict[str, Any]) -> None:
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    if isinstance(fmt, dict) and isinstance(fmt.get("schema"), dict):
        fmt["schema"] = dict(ANY_OBJECT)
    choice, tools = body.get("tool_choice"), _list(body.get("tools"))
    if not (isinstance(choice, dict) and choice.get("type") in ("any", "tool")):
        return
    if not tools:
        body["tool_choice"] = None
        return
    _plain_parameters(tools, "input_schema")
    if choice["type"] == "tool" and _name(choice.get("name")) and isinstance(tools[0], dict) and _name(tools[0].get("name")):
        choice["name"] = tools[0]["name"]


def _responses(body: dict[str, Any]) -> None:
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        fmt["schema"] = dict(ANY_OBJECT)
    choice = body.get("tool_choice")
    # Tools of other types are ignored (valid, but nothing a call could be forced to).
    tools = [t for t in _list(body.get("tools")) if isinstance(t, dict) and t.get("type") == "function"]
    if not (choice == "required" or isinstance(choice, dict)):
        return
    if not tools:
        body["tool_choice"] = "auto"
        return
    _plain_parameters(tools, "parameters")
    if isinstance(choice, dict) and _name(choice.get("name")) and _name(tools[0].get("name")):
        choice["name"] = tools[0]["name"]


def _image_urls(body: dict[str, Any]) -> None:
    """Each image part's URL (chat `image_url`, Messages `image` sources, Responses `input_image`) as a PNG;
    the parts past the server's MAX_IMAGES per request become text parts."""
    turns = _list(body.get("messages")) + _list(body.get("input"))
    seen = 0
    for turn in turns:
        parts = _list(turn.get("content")) if isinstance(turn, dict) else []
        for i, part in enumerate(parts):
            if isinstance(part, dict) and isinstance(part.get("type"), str) and part["type"] in IMAGE_PARTS:
                seen += 1
                if seen > MAX_IMAGES:
                    parts[i] = {"type": IMAGE_PARTS[part["type"]], "text": "x"}
                else:
                    _png(part)


def _png(part: dict[str, Any]) -> None:
    if _name(part.get("image_url")):
        part["image_url"] = PNG_URL
    inner = part.get("image_url") if part.get("type") == "image_url" else None
    if isinstance(inner, dict) and _name(inner.get("url")):
        inner["url"] = PNG_URL
    source = part.get("source") if part.get("type") == "image" else None
    if isinstance(source, dict) and source.get("type") == "url" and _name(source.get("url")):
        source["url"] = PNG_URL
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str) \
            and source.get("media_type") in ("image/png", "image/jpeg", "image/webp", "image/gif"):
        source["data"] = PNG_B64


def _plain_parameters(tools: list[Any], key: str) -> None:
    """The schema of each forced tool's arguments, when it is one, as any object."""
    for tool in tools:
        if isinstance(tool, dict) and isinstance(tool.get(key), dict):
            tool[key] = dict(ANY_OBJECT)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _name(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


FIXES = {"/v1/chat/completions": (_chat_format, _chat_forced_call, _image_urls), "/v1/completions": (_chat_format,),
         "/v1/messages": (_messages, _image_urls), "/v1/messages/count_tokens": (_messages, _image_urls),
         "/v1/responses": (_responses, _image_urls)}
