"""The OpenAPI schema: the contract, exactly as the app in front of it enforces it.

- Statuses: the ones the server really returns. FastAPI would document 422 for validation errors;
  we answer 400 instead, so 422 is removed.
- Request bodies are parsed by `server.body`, so their schemas are added here. A value the server
  refuses is a schema rule wherever JSON Schema can say it (`n` only 1, empty prompts, `stop`
  counts, `logit_bias` keys and ranges, `tool_choice`, `stream_options` without `stream`, ...);
  the rest is in the field descriptions.
- The policy in force decides the rest: tolerant (default), every request object allows other
  properties (they are ignored and reported); `--strict-params`, none does (`additionalProperties:
  false`), the inert OpenAI fields are listed with the only values accepted, and `stop` takes 4.
- Once the model is loaded, token ids (`logit_bias` keys, token-id prompts) are bounded by its
  vocabulary and `max_tokens` by its context window. The schema is cached from then on.
- Streams are OpenAPI 3.1 `text/event-stream` with an `itemSchema` for each event: its `data` is a
  chunk (JSON), an error after the stream started (JSON), or the final `[DONE]`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from engine.api import EngineInfo
from server import policy
from server.messages.protocol import CountTokensRequest, MessagesRequest
from server.protocol import (
    OPENAI_MAX_STOP,
    TOLERANT_ONLY,
    VISION_ONLY,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
)

ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Invalid request: malformed JSON, wrong types or values, what would be served wrongly (n > 1, audio "
         "input, images for a model that does not take them or that cannot be fetched or decoded, a response_format or tool schema the grammar engine cannot enforce), unknown fields under "
         "--strict-params, or prompt + max_tokens beyond the context window (code context_length_exceeded)",
    401: "Missing or wrong API key (only when the server runs with --api-key)",
    404: "Unknown model (code model_not_found) or URL",
    413: "Request body larger than the server's limit",
    415: "The body is not sent as Content-Type: application/json",
    421: "The Host header is not this server's (DNS-rebinding guard; see --allowed-hosts)",
    429: "Admission queue full; retry after the Retry-After header's seconds",
    500: "The engine failed on this request (sanitized; details in the server log)",
    503: "Engine loading (with Retry-After), dead, or the server is shutting down",
}

REQUEST_MODELS: tuple[type[BaseModel], ...] = (ChatCompletionRequest, CompletionRequest, MessagesRequest,
                                               CountTokensRequest)
# Models referenced by name from routes (SSE chunk shapes and replies).
RESPONSE_MODELS: tuple[type[BaseModel], ...] = (
    ChatCompletionResponse, ChatCompletionChunk, CompletionResponse, ErrorResponse,
)
DONE = "[DONE]"
_REF = "#/components/schemas/{model}"


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: each status with the OpenAI error body."""
    return {s: {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[s]} for s in statuses}


def ok_response(json_model: str, chunk_model: str) -> dict[int | str, dict[str, Any]]:
    """`responses=` entry for 200: JSON, or with `stream: true` an SSE stream described event by event."""
    content = {"application/json": {"schema": _ref(json_model)},
               "text/event-stream": {"itemSchema": sse_event(chunk_model)}}
    description = ("The completion, or with `stream: true` server-sent events: one `data:` chunk per event, "
                   "then `data: [DONE]`. An error after the stream started is one `data: {\"error\": ...}` "
                   "event, after which the stream closes without `[DONE]`. Comment lines (`: keep-alive`, "
                   "`: queued position=N`) are not events.")
    return {200: {"description": description, "content": content}}


def sse_event(chunk_model: str) -> dict[str, Any]:
    """One server-sent event of a stream, as parsed (`data` joined; `event` is "message")."""
    data = {"anyOf": [
        {"const": DONE, "description": "the last event of a stream that finished"},
        {"type": "string", "contentMediaType": "application/json", "contentSchema": _ref(chunk_model)},
        {"type": "string", "contentMediaType": "application/json", "contentSchema": _ref("ErrorResponse"),
         "description": "an error after the stream started; the stream then closes without [DONE]"},
    ]}
    return {"type": "object", "required": ["data"], "properties": {"data": data, "event": {"const": "message"}}}


def request_body(model_name: str) -> dict[str, Any]:
    """`openapi_extra=` documenting a JSON body parsed by `server.body`."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": _ref(model_name)}}}}


def _ref(model_name: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=model_name)}


def build(app: FastAPI) -> dict[str, Any]:
    """The app's schema for its policy and its model (install with `app.openapi = lambda: build(app)`).

    Cached on the app once the model is loaded; until then it is rebuilt, without the model's bounds.
    """
    if app.openapi_schema:
        return app.openapi_schema
    app_state = app.state.app_state
    info = app_state.engine.info() if app_state.engine is not None and app_state.state == "ready" else None
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(request_schemas(bool(app_state.settings.strict_params), info))
    vision = bool(info is not None and info.vision)
    for model in RESPONSE_MODELS:
        _add_model(components, model)
    strict = bool(app_state.settings.strict_params)
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
            _apply_policy_inline(operation, strict, vision)
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    if info is not None:
        app.openapi_schema = schema
    return schema


def request_schemas(strict: bool, info: EngineInfo | None) -> dict[str, Any]:
    """The components of the request bodies under the policy (`strict`) and the served model (`info`)."""
    components: dict[str, Any] = {}
    for model in REQUEST_MODELS:
        _add_model(components, model)
    vision = bool(info is not None and info.vision)
    for component in components.values():
        _select_branches(component, strict, vision)
        _set_additional_properties(component, allowed=not strict)
    for model in REQUEST_MODELS:
        body = components[model.__name__]
        if strict:
            body["properties"].update(_inert_properties())
            if "stop" in body["properties"]:
                _limit_stop(body["properties"]["stop"], OPENAI_MAX_STOP)
        if info is not None:
            _apply_model_bounds(body["properties"], info)
    return components


def _add_model(components: dict[str, Any], model: type[BaseModel]) -> None:
    """`model`'s schema and the models it refers to, as components."""
    schema = model.model_json_schema(ref_template=_REF)
    _json_schema_bounds(schema)
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema


_CONDITIONS = ("if", "then", "else", "not")  # subschemas that test a body, not describe one
# pydantic writes a constraint it cannot place (on `Annotated[int, ...] | None`) under its own name.
_BOUND_KEYWORDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def _set_additional_properties(node: Any, allowed: bool) -> None:
    """Every object with listed `properties` and no rule of its own for others: allow them or not.

    Objects that are free-form maps (`logit_bias`, tool `parameters`, `response_format`) say so
    themselves and are left alone: the server takes any key there in either policy.
    """
    if isinstance(node, list):
        for item in node:
            _set_additional_properties(item, allowed)
    if not isinstance(node, dict):
        return
    if "properties" in node and "additionalProperties" not in node:
        node["additionalProperties"] = allowed
    for key, value in node.items():
        if key == "properties":
            for prop in value.values():
                _set_additional_properties(prop, allowed)
        elif key not in _CONDITIONS:
            _set_additional_properties(value, allowed)


def _select_branches(node: Any, strict: bool, vision: bool) -> None:
    """Drop the `anyOf` branches marked TOLERANT_ONLY under --strict-params, and those marked VISION_ONLY
    (image parts) unless the served model takes images; then the marks."""
    if isinstance(node, list):
        for item in node:
            _select_branches(item, strict, vision)
    if not isinstance(node, dict):
        return
    dropped = ([TOLERANT_ONLY] if strict else []) + ([] if vision else [VISION_ONLY])
    if dropped and isinstance(node.get("anyOf"), list):
        node["anyOf"] = [b for b in node["anyOf"] if not (isinstance(b, dict) and any(b.get(m) for m in dropped))]
    node.pop(TOLERANT_ONLY, None)
    node.pop(VISION_ONLY, None)
    for value in node.values():
        _select_branches(value, strict, vision)


def _json_schema_bounds(node: Any) -> None:
    """Rename pydantic's `ge`/`le`/`gt`/`lt` to the JSON Schema keywords, so validators enforce them."""
    if isinstance(node, list):
        for item in node:
            _json_schema_bounds(item)
    if not isinstance(node, dict):
        return
    if node.get("type") in ("integer", "number"):
        for ours, theirs in _BOUND_KEYWORDS.items():
            if ours in node:
                node[theirs] = node.pop(ours)
    for key, value in node.items():
        if key == "properties":
            for prop in value.values():
                _json_schema_bounds(prop)
        else:
            _json_schema_bounds(value)


def _inert_properties() -> dict[str, Any]:
    """--strict-params: the inert OpenAI fields, each with the values accepted (null always means unset)."""
    out: dict[str, Any] = {}
    for name, noop in policy.INERT.items():
        if noop is policy.ANY:
            out[name] = {"description": "accepted and ignored"}
        elif noop is None:
            out[name] = {"type": "null", "description": "accepted only as null"}
        else:
            out[name] = {"enum": [noop, None], "description": f"accepted only as {noop!r} or null"}
    return out


def _limit_stop(stop: dict[str, Any], limit: int) -> None:
    """Set the largest number of stop strings in the array form of `stop`."""
    for branch in stop["anyOf"]:
        if branch.get("type") == "array":
            branch["maxItems"] = limit
    stop["description"] = f"up to {limit} non-empty strings"


def _apply_model_bounds(props: dict[str, Any], info: EngineInfo) -> None:
    """Bounds that depend on the served model: token ids below its vocabulary, lengths within its window."""
    for name in ("max_tokens", "max_completion_tokens"):
        if name in props:
            _integer_branch(props[name])["maximum"] = info.context_length - 1  # the prompt takes one at least
    if not info.vocab_size or "logit_bias" not in props:
        return
    bias = _object_branch(props["logit_bias"])
    bias["propertyNames"] = {"pattern": f"^{decimal_below(info.vocab_size)}$"}
    if "prompt" in props:
        for branch in props["prompt"]["anyOf"]:
            items = branch.get("items", {})
            if items.get("type") == "array":
                items = items["items"]
            if items.get("type") == "integer":
                items["maximum"] = info.vocab_size - 1


def _integer_branch(prop: dict[str, Any]) -> dict[str, Any]:
    return next(b for b in prop.get("anyOf", [prop]) if b.get("type") == "integer")


def _object_branch(prop: dict[str, Any]) -> dict[str, Any]:
    return next(b for b in prop.get("anyOf", [prop]) if b.get("type") == "object")


def decimal_below(n: int) -> str:
    """A regex (no anchors) for the canonical decimals 0 .. n-1: no sign, no leading zeros.

    Example: n = 250 -> `(?:0|[1-9][0-9]{0,1}|[1-1][0-9]{2}|2[0-3][0-9]{1}|24[0-8]|249)`: zero, the
    shorter numbers, then digit by digit the numbers that share a prefix with 249 and continue with a
    smaller digit, and 249 itself.
    """
    top = str(n - 1)
    parts = ["0"]
    if len(top) > 1:
        parts.append(f"[1-9][0-9]{{0,{len(top) - 2}}}")
    for i, digit in enumerate(top):
        low = 1 if i == 0 else 0
        if int(digit) > low:
            rest = len(top) - i - 1
            parts.append(f"{top[:i]}[{low}-{int(digit) - 1}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    if top != "0":
        parts.append(top)
    return "(?:" + "|".join(parts) + ")"


def _apply_policy_inline(operation: dict[str, Any], strict: bool, vision: bool) -> None:
    """A request body a route documents inline (not a component): the policy's additional properties,
    the image parts if the model takes images, and under --strict-params the inert OpenAI fields it
    accepts at their no-op values."""
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if not isinstance(body, dict) or "$ref" in body:
        return
    _select_branches(body, strict, vision)
    _set_additional_properties(body, allowed=not strict)
    if strict:
        body["properties"].update({k: v for k, v in _inert_properties().items() if k not in body["properties"]})
