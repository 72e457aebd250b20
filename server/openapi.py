"""The OpenAPI schema: the statuses the server really returns, and the request bodies we parse.

FastAPI would document 422 for validation errors; we answer 400 instead, so 422 is removed.
Request bodies are parsed by `server.body`, so their schemas are added here by hand.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from server.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    TextPart,
)

ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Invalid request: malformed JSON, wrong types or values, unsupported or unknown fields, "
         "or prompt + max_tokens beyond the context window (code context_length_exceeded)",
    401: "Missing or wrong API key (only when the server runs with --api-key)",
    404: "Unknown model (code model_not_found) or URL",
    413: "Request body larger than the server's limit",
    429: "Admission queue full; retry after the Retry-After header's seconds",
    500: "The engine failed on this request (sanitized; details in the server log)",
    503: "Engine loading (with Retry-After), dead, or the server is shutting down",
}

# Models referenced by name from routes (bodies we parse ourselves, SSE chunk shapes).
_DOCUMENTED_MODELS: tuple[type[BaseModel], ...] = (
    ChatCompletionRequest, CompletionRequest, TextPart, ChatCompletionResponse, ChatCompletionChunk, CompletionResponse
)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: each status with the OpenAI error body."""
    return {s: {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[s]} for s in statuses}


def ok_response(json_model: str, chunk_model: str) -> dict[int | str, dict[str, Any]]:
    """`responses=` entry for 200: JSON, or an SSE stream of chunks with `stream: true`."""
    content = {"application/json": {"schema": _ref(json_model)}, "text/event-stream": {"schema": _ref(chunk_model)}}
    description = "The completion, or with `stream: true` SSE `data:` chunks ending in `data: [DONE]`"
    return {200: {"description": description, "content": content}}


def request_body(model_name: str) -> dict[str, Any]:
    """`openapi_extra=` documenting a JSON body parsed by `server.body`."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": _ref(model_name)}}}}


def _ref(model_name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model_name}"}


def build(app: FastAPI) -> dict[str, Any]:
    """The app's schema, cached on the app (install with `app.openapi = lambda: build(app)`)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in _DOCUMENTED_MODELS:
        model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(model_schema.pop("$defs", {}))
        components[model.__name__] = model_schema
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    app.openapi_schema = schema
    return schema
