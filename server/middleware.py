"""Bearer API-key check, as pure ASGI middleware so streamed responses pass through untouched."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import APIError

OPEN_PATHS = frozenset({"/health"})

_MISSING = ("You didn't provide an API key. Send it in an Authorization header using Bearer auth "
            "(Authorization: Bearer YOUR_KEY).")


class ApiKeyMiddleware:
    """401 (OpenAI-shaped) on every path but /health unless `Authorization: Bearer <key>` matches."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        error = self._check(dict(scope["headers"]).get(b"authorization"))
        if error is None:
            await self.app(scope, receive, send)
            return
        await error.response()(scope, receive, send)

    def _check(self, header: bytes | None) -> APIError | None:
        """None when authorized, else the 401 to send."""
        scheme, _, token = (header or b"").partition(b" ")
        if not header or scheme.lower() != b"bearer" or not token.strip():
            return _unauthorized(_MISSING)
        if not hmac.compare_digest(token.strip(), self._key):
            return _unauthorized("Incorrect API key provided.")
        return None


def _unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
