"""Request body -> validated protocol model, or an OpenAI-shaped 400/413/415.

We read and parse bodies ourselves (not FastAPI's body params) to control every failure: the size
cap is enforced while reading, NaN/Infinity literals and nesting deeper than `MAX_JSON_DEPTH` are
refused, and each pydantic error becomes one message naming the field.

`Content-Type: application/json` is required (415 otherwise, checked before the body is read):
browsers send text/plain, form and multipart bodies to any site without asking first, but a JSON
body from another origin needs a CORS preflight, which only `--allowed-origins` pass. Plain
`curl -d` therefore needs `-H "Content-Type: application/json"`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from server import policy
from server.errors import APIError, request_too_large

M = TypeVar("M", bound=BaseModel)

JSON_MEDIA_TYPE = "application/json"

# Deepest array/object nesting accepted. Real requests need about 6 levels; a bound keeps deep bodies
# from reaching the recursive JSON parser's limit and every later walk over the value.
MAX_JSON_DEPTH = 64

_TOO_DEEP = f"The request body is nested too deeply: at most {MAX_JSON_DEPTH} levels of arrays and objects."

# A `\uD800`-`\uDFFF` escape in the raw body: the only way a lone surrogate gets into a parsed string
# (raw UTF-8 cannot carry one), so bodies without it skip the walk in `refuse_lone_surrogates`.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")

_TYPE_ERRORS = frozenset(
    {"string_type", "int_type", "float_type", "bool_type", "list_type", "dict_type", "model_type",
     "model_attributes_type", "int_from_float", "invalid_type"}
)


def require_json(request: Request) -> None:
    """415 unless the request declares `application/json` (any case, parameters such as charset allowed)."""
    declared = request.headers.get("content-type", "")
    if declared.partition(";")[0].strip().lower() != JSON_MEDIA_TYPE:
        got = f"Content-Type {declared[:100]!r} is" if declared else "A request without a Content-Type is"
        raise APIError(415, f"{got} not supported: send the JSON body with `Content-Type: application/json`.",
                       code="unsupported_media_type")


async def read_limited(request: Request, limit: int) -> bytes:
    """The raw body; 413 as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise request_too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise request_too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:
        raise APIError(499, "Client closed the request.", code="client_closed_request") from None
    return b"".join(chunks)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Strict JSON (no NaN/Infinity) that must be an object."""
    if not raw.strip():
        raise APIError(400, "The request body is empty; expected a JSON object.", code="invalid_json")
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:  # far deeper than MAX_JSON_DEPTH: the parser itself gave up
        raise APIError(400, _TOO_DEEP, code="invalid_json") from None
    except UnicodeDecodeError:
        raise APIError(400, "The request body is not valid UTF-8.", code="invalid_json") from None
    except json.JSONDecodeError as exc:  # our words around the parser's position and reason
        raise APIError(400, f"The request body is not valid JSON: {exc.msg} at line {exc.lineno}, column "
                            f"{exc.colno}.", code="invalid_json") from None
    except _NotJson as exc:
        raise APIError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    except ValueError:  # e.g. an integer literal past Python's digit limit
        raise APIError(400, "The request body is not valid JSON: it holds a number too long to read.",
                       code="invalid_json") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise APIError(400, _TOO_DEEP, code="invalid_json")
    if not isinstance(value, dict):
        raise APIError(400, f"The request body must be a JSON object, not {_json_kind(value)}.", code="invalid_body")
    if _SURROGATE_ESCAPE.search(raw):
        refuse_lone_surrogates(value)
    return value


def refuse_lone_surrogates(value: Any) -> None:
    """400 naming a string (or key) that holds a lone UTF-16 surrogate such as `"\\ud800"`.

    JSON's grammar allows the escape, but the text is not Unicode: no tokenizer can encode it and no
    reply could echo it, so it is refused here, before anything reads it.
    """
    path = _lone_surrogate_path(value)
    if path is not None:
        where = f"'{path}'" if path else "a field name"
        raise APIError(400, f"Invalid value for {where}: the text holds a lone UTF-16 surrogate (an unpaired "
                            "\\ud800-\\udfff escape); send valid Unicode.", param=path or None, code="invalid_value")


def _lone_surrogate_path(value: Any) -> str | None:
    """Where in `value` a string or key holds a lone surrogate (`messages[0].content`; a key: the object
    holding it, "" for the body), else None."""
    pending: list[tuple[Any, str]] = [(value, "")]
    while pending:
        node, path = pending.pop()
        if isinstance(node, str) and _has_lone_surrogate(node):
            return path
        if isinstance(node, dict):
            for key, child in node.items():
                where = f"{path}.{key}" if path else key
                if _has_lone_surrogate(key):
                    return path
                pending.append((child, where))
        elif isinstance(node, list):
            pending.extend((child, f"{path}[{i}]") for i, child in enumerate(node))
    return None


def _has_lone_surrogate(text: str) -> bool:
    """True when `text` cannot be encoded as UTF-8 (JSON decoding already paired the valid surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def json_depth(value: Any) -> int:
    """How deeply arrays and objects nest in a parsed JSON value (a scalar is 0, `[]` is 1).

    Iterative, so it cannot itself hit the recursion limit; it stops early (with a result above the
    limit) once the value is known to nest deeper than MAX_JSON_DEPTH.
    """
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending and deepest <= MAX_JSON_DEPTH:
        node, depth = pending.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth + 1)
            children = node.values() if isinstance(node, dict) else node
            pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def validate(model: type[M], data: dict[str, Any], strict_params: bool = False,
             unmodelled: list[str] | None = None) -> M:
    """`model.model_validate(data)` with the first error turned into an OpenAI 400.

    Under `strict_params` a field the server would ignore is refused first (`server.policy`);
    `unmodelled` is `policy.unmodelled(model, data)` when the caller has it already.
    """
    if strict_params:
        policy.refuse_unmodelled(data, policy.unmodelled(model, data) if unmodelled is None else unmodelled)
    try:
        return model.model_validate(data, context={"strict_params": strict_params})
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def body_of(model: type[M], limit: Callable[[Request], int],
            strict: Callable[[Request], bool]) -> Callable[[Request], Awaitable[M]]:
    """A FastAPI dependency that yields the validated body of type `model`.

    The names of the fields it ignored are left in `request.state.ignored_fields` (see `ignored`).
    """

    async def dependency(request: Request) -> M:
        require_json(request)
        data = parse_json_object(await read_limited(request, limit(request)))
        unmodelled = policy.unmodelled(model, data)
        body = validate(model, data, strict(request), unmodelled)
        request.state.ignored_fields = policy.field_names(unmodelled)
        return body

    return dependency


def ignored(request: Request) -> list[str]:
    """The field names the request's body carried that the server ignored (after `body_of`)."""
    return list(getattr(request.state, "ignored_fields", []))


def from_validation_error(exc: ValidationError) -> APIError:
    """One clear 400 from pydantic's error list (the first error; they are field-ordered)."""
    error = exc.errors(include_url=False)[0]
    kind, msg = error["type"], error["msg"]
    ctx = error.get("ctx") or {}
    param = param_name(error["loc"]) or ctx.get("param")
    if kind == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {param}", param=param,
                        code="unrecognized_argument")
    if kind == "missing":
        return APIError(400, f"Missing required parameter: '{param}'.", param=param,
                        code="missing_required_parameter")
    if kind in _TYPE_ERRORS:
        return APIError(400, f"Invalid type for '{param}': {msg}.", param=param, code="invalid_type")
    if kind == "finite_number":
        return APIError(400, f"Invalid value for '{param}': NaN and Infinity are not allowed.", param=param,
                        code="invalid_value")
    if kind in ("unsupported_parameter", "unsupported_content_part"):
        return APIError(400, msg, param=param, code="unsupported_parameter")
    if kind == "invalid_value":
        return APIError(400, msg, param=param, code="invalid_value")
    return APIError(400, f"Invalid value for '{param}': {msg}.", param=param, code="invalid_value")


def param_name(loc: tuple[int | str, ...]) -> str | None:
    """('messages', 0, 'content') -> 'messages[0].content'. A union's tag (`<image>`) is not a field: left out."""
    out = ""
    for part in loc:
        if isinstance(part, str) and part.startswith("<") and part.endswith(">"):
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


class _NotJson(ValueError):
    """A literal Python's parser takes but JSON does not (NaN, Infinity)."""


def _refuse_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not valid JSON")


def _json_kind(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
