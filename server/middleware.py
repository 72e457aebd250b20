"""API-key check, DNS-rebinding guard and Anthropic error envelopes, as pure ASGI middleware so
streams pass through untouched."""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Callable, Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import APIError

OPEN_PATHS = frozenset({"/health"})

_MISSING = ("You didn't provide an API key. Send it in an Authorization header using Bearer auth "
            "(Authorization: Bearer YOUR_KEY), or in an x-api-key header.")


class ApiKeyMiddleware:
    """401 on every path but /health (and those `is_open` admits: the chat page's files) unless
    `Authorization: Bearer <key>` or (Anthropic's clients) `x-api-key: <key>` matches."""

    def __init__(self, app: ASGIApp, api_key: str, is_open: Callable[[str], bool] | None = None) -> None:
        self.app = app
        self._key = api_key.encode()
        self._is_open = is_open or (lambda path: False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        error = self._check(headers.get(b"authorization"), headers.get(b"x-api-key"))
        if error is None:
            await self.app(scope, receive, send)
            return
        await error.response()(scope, receive, send)

    def _check(self, header: bytes | None, api_key: bytes | None) -> APIError | None:
        """None when authorized, else the 401 to send."""
        scheme, _, token = (header or b"").partition(b" ")
        if (not header or scheme.lower() != b"bearer" or not token.strip()) and api_key:
            scheme, token = b"bearer", api_key
        if scheme.lower() != b"bearer" or not token.strip():
            return _unauthorized(_MISSING)
        if not hmac.compare_digest(token.strip(), self._key):
            return _unauthorized("Incorrect API key provided.")
        return None


def _unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


# Hosts a loopback-bound server always answers, besides any loopback IP literal (127.0.0.0/8, ::1).
LOCAL_HOSTNAMES = frozenset({"localhost"})
ANY_HOST = "*"


class HostGuardMiddleware:
    """421 (OpenAI-shaped) unless the `Host` header names this machine or an allowed host.

    DNS rebinding: a page on evil.example re-points its own name at 127.0.0.1, and the browser then
    treats the local server as same-origin with it. The `Host` header still says evil.example, so
    refusing unknown names keeps such pages from reading or driving the server, /health included.
    """

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        self._allowed = frozenset(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Every Host header must pass (there is normally exactly one); none at all is refused too.
        names = [hostname(value.decode("latin-1")) for key, value in scope["headers"] if key == b"host"]
        refused = next((name for name in names if not self._admits(name)), None if names else "")
        if refused is None:
            await self.app(scope, receive, send)
            return
        await _host_not_allowed(refused).response()(scope, receive, send)

    def _admits(self, name: str) -> bool:
        return name in self._allowed or is_loopback(name)


def guarded_hosts(bind_host: str, allowed_hosts: Iterable[str]) -> frozenset[str] | None:
    """The extra Host names the guard admits, or None when there is no guard.

    On by default only for a loopback bind: a server bound to a public interface is reached under
    names we cannot guess, so there it is opt-in (`--allowed-hosts`). `*` turns it off.
    """
    extra = frozenset(hostname(host) for host in allowed_hosts)
    if ANY_HOST in extra or not (extra or is_loopback(bind_host)):
        return None
    return extra


def hostname(authority: str) -> str:
    """The lowercase host of a `Host` value: no port, no IPv6 brackets (`[::1]:8000` -> `::1`)."""
    value = authority.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:  # name:port; more colons is a bare IPv6 literal
        return value.partition(":")[0]
    return value


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback IP literal (127.0.0.0/8, ::1); brackets and a port are allowed."""
    name = hostname(host)
    if name in LOCAL_HOSTNAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_not_allowed(name: str) -> APIError:
    """421 naming the refused host and the flag that would admit it."""
    name = name[:100]  # the header is client-chosen: echo a bounded part of it
    refusal = f"Host {name!r} is not allowed" if name else "A Host header is required"
    flag = name or "NAME"
    return APIError(421, f"{refusal}: this server answers only requests addressed to localhost, 127.0.0.1, [::1] "
                         f"or a name given with --allowed-hosts (DNS-rebinding protection). To allow it, start the "
                         f"server with --allowed-hosts {flag} (or DSPARK_ALLOWED_HOSTS={flag}).",
                    code="host_not_allowed")


class AnthropicErrorMiddleware:
    """On the Messages API's paths, JSON error responses (from any layer: body validation, the API
    key, routing, admission) are rewritten into Anthropic's envelope
    `{"type": "error", "error": {"type", "message"}}`; everything else passes through untouched."""

    def __init__(self, app: ASGIApp, prefix: str, envelope) -> None:
        self.app, self._prefix, self._envelope = app, prefix, envelope

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self._prefix):
            await self.app(scope, receive, send)
            return
        start: dict | None = None
        body = b""

        async def rewriting(message: dict) -> None:
            nonlocal start, body
            if message["type"] == "http.response.start" and message["status"] >= 400 and _is_json(message):
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                await self._send_rewritten(send, start, body)

        await self.app(scope, receive, rewriting)

    async def _send_rewritten(self, send: Send, start: dict, body: bytes) -> None:
        try:
            error = json.loads(body)["error"]
            body = json.dumps(self._envelope(start["status"], error["message"])).encode()
        except (ValueError, KeyError, TypeError):
            pass  # not an error object: sent as it was
        headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
        await send({**start, "headers": headers + [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _is_json(start: dict) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"application/json") for k, v in start["headers"])
