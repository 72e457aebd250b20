"""Request body -> validated protocol model, or an OpenAI-shaped 400/413.

We read and parse bodies ourselves (not FastAPI's body params) to control every failure: the size
cap is enforced while reading, NaN/Infinity literals are refused, the content type is not
required (curl's default works), and each pydantic error becomes one message naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from server.errors import APIError, request_too_large

M = TypeVar("M", bound=BaseModel)

_TYPE_ERRORS = frozenset(
    {"string_type", "int_type", "float_type", "bool_type", "list_type", "dict_type", "model_type",
     "model_attributes_type", "int_from_float", "invalid_type"}
)


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
    except UnicodeDecodeError:
        raise APIError(400, "The request body is not valid UTF-8.", code="invalid_json") from None
    except json.JSONDecodeError as exc:
        raise APIError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    except ValueError as exc:
        raise APIError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    if not isinstance(value, dict):
        raise APIError(400, f"The request body must be a JSON object, not {_json_kind(value)}.", code="invalid_body")
    return value


def validate(model: type[M], data: dict[str, Any]) -> M:
    """`model.model_validate(data)` with the first error turned into an OpenAI 400."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def body_of(model: type[M], limit: Callable[[Request], int]) -> Callable[[Request], Awaitable[M]]:
    """A FastAPI dependency that yields the validated body of type `model`."""

    async def dependency(request: Request) -> M:
        return validate(model, parse_json_object(await read_limited(request, limit(request))))

    return dependency


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
    """('messages', 0, 'content') -> 'messages[0].content'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _json_kind(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
