"""Every error the server returns, OpenAI-shaped: `{"error": {"message", "type", "param", "code"}}`.

One mapping table (`ENGINE_ERRORS`) turns engine exceptions into HTTP statuses; the handlers
installed by `install()` cover our own `APIError`, routing 404/405 and anything unexpected (500,
sanitized; the traceback goes to the log). Client input never produces a 5xx.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.api import (
    ContextLengthExceeded,
    EngineDead,
    EngineError,
    EngineInputError,
    EngineNotReady,
    EngineOverloaded,
)

log = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
RATE_LIMIT = "rate_limit_error"
UNAVAILABLE = "service_unavailable_error"
SERVER_ERROR = "server_error"

# The mapping table: engine exception -> (HTTP status, OpenAI error type). First match wins.
ENGINE_ERRORS: tuple[tuple[type[EngineError], int, str], ...] = (
    (ContextLengthExceeded, 400, INVALID_REQUEST),
    (EngineInputError, 400, INVALID_REQUEST),
    (EngineOverloaded, 429, RATE_LIMIT),
    (EngineNotReady, 503, UNAVAILABLE),
    (EngineDead, 503, UNAVAILABLE),
    (EngineError, 500, SERVER_ERROR),
)

# Default OpenAI error type for statuses we raise without an engine exception.
STATUS_TYPES: dict[int, str] = {429: RATE_LIMIT, 500: SERVER_ERROR, 503: UNAVAILABLE}

SANITIZED_500 = "The engine failed while generating this request; the server log has the details."

# What a client is told when the chat template or the tokenizer failed on its input (keyed by the
# error's param). Their own text can name Python exceptions, tokenizer internals or file paths, so it
# goes to the log; only a template's own `raise_exception(...)` text, written for users, is passed on.
RENDER_FAILED: dict[str | None, str] = {
    "messages": "The model's chat template could not render these messages.",
    "prompt": "The tokenizer could not encode this prompt.",
    None: "The prompt could not be rendered.",
}

ErrorHook = Callable[[Request, "APIError"], None]


class APIError(Exception):
    """An error response in OpenAI's shape; raise it anywhere before a response has started."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or STATUS_TYPES.get(status, INVALID_REQUEST)
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body, also used as the payload of an SSE error event."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        """The HTTP response for this error."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def from_engine_error(exc: EngineError, *, retry_after_s: int | None = None) -> APIError:
    """Map an engine exception through `ENGINE_ERRORS`; 500s get a sanitized message."""
    status, error_type = next((s, t) for cls, s, t in ENGINE_ERRORS if isinstance(exc, cls))
    message = _input_message(exc) if isinstance(exc, EngineInputError) else str(exc) or exc.code
    if status == 500:
        log.error("engine failure: %r", exc)
        message = SANITIZED_500
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None and status in (429, 503) else None
    param = getattr(exc, "param", None)
    return APIError(status, message, type=error_type, param=param, code=exc.code, headers=headers)


def _input_message(exc: EngineInputError) -> str:
    """The client's message for an input error: ours as written; a wrapped library failure sanitized."""
    cause = exc.__cause__
    if cause is None or isinstance(cause, EngineError):
        return str(exc) or exc.code
    log.info("request input refused by the chat template or tokenizer: %r", cause)
    param = getattr(exc, "param", None)
    message = RENDER_FAILED.get(param, RENDER_FAILED[None])
    refusal = _template_refusal(cause)
    return f"{message} The template says: {refusal}" if refusal else message


def _template_refusal(cause: BaseException) -> str | None:
    """The text of a template's `raise_exception(...)`: exactly Jinja's base TemplateError (syntax, undefined
    and other Jinja errors are subclasses and stay in the log)."""
    kind = type(cause)
    if kind.__name__ == "TemplateError" and kind.__module__.startswith("jinja2"):
        return str(cause)[:500] or None
    return None


def request_too_large(limit: int) -> APIError:
    """413 for a body above the configured limit."""
    return APIError(413, f"Request body too large: the limit is {limit} bytes.", code="request_too_large")


def not_ready(state: str, reason: str | None, retry_after_s: int) -> APIError:
    """503 while the engine loads, after it died, or while the server drains."""
    if state == "loading":
        return APIError(503, "The model is still loading; retry shortly.", code="engine_loading",
                        headers={"Retry-After": str(retry_after_s)})
    if state == "draining":
        return APIError(503, "The server is shutting down.", code="server_shutting_down")
    return APIError(503, f"The engine is not running: {reason or 'unknown reason'}.", code="engine_dead")


def install(app: FastAPI, on_error: ErrorHook | None = None) -> None:
    """Register the handlers that make every error response OpenAI-shaped."""
    hook = on_error or (lambda request, exc: None)

    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        hook(request, exc)
        return exc.response()

    async def engine_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, EngineError)
        return await api_error(request, from_engine_error(exc))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return await api_error(request, _from_http_exception(request, exc))

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        # Only reachable for non-body parameters: bodies are validated in server.body.
        return await api_error(request, APIError(400, f"Invalid request: {exc}", code="invalid_value"))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return await api_error(request, APIError(500, "Internal server error.", code="internal_error"))

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(EngineError, engine_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected)


def _from_http_exception(request: Request, exc: StarletteHTTPException) -> APIError:
    """Routing errors (404 unknown URL, 405 wrong method) in OpenAI's words."""
    where = f"{request.method} {request.url.path}"
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        return APIError(404, f"Invalid URL ({where}).", code="not_found", headers=headers)
    if exc.status_code == 405:
        return APIError(405, f"Method not allowed ({where}).", code="method_not_allowed", headers=headers)
    return APIError(exc.status_code, str(exc.detail), headers=headers)
