"""Browser-safe defaults: no web page the user visits can read or drive the local server.

- DNS rebinding: a loopback-bound server answers 421 to a Host that is not this machine's.
- Cross-site "simple requests": POST bodies must be `application/json` (415 otherwise).
- Deeply nested JSON is a 400, never a 500.
- CORS (opt-in) admits the OpenAI JS SDK's preflight from an allowed origin only.

Every client here fails the test on any 5xx (see `_no_server_error`).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from dspark_cli.main import build_parser
from dspark_cli.serve import settings_from_args
from server.app import create_app
from server.body import MAX_JSON_DEPTH
from server.settings import ServerSettings
from tests.server.conftest import CHAT, COMPLETIONS, chat_body, live_server, settings
from tests.server.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio

KEY = "sk-local-test"
APP_ORIGIN = "http://app.example"
ROUTES = (("POST", CHAT), ("GET", "/v1/models"), ("GET", "/health"))
LOCAL_HOSTS = ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "localhost", "LocalHost:8000", "127.0.0.2:8000")
FOREIGN_HOSTS = ("evil.example", "evil.example:8000", "localhost.evil.example", "127.0.0.1.nip.io:8000")
SDK_HEADERS = "authorization, content-type, x-stainless-os, x-stainless-retry-count"


# Large enough for the 100k-deep bodies (the test settings cap bodies at 64 KiB).
BIG_BODIES = 2 * 1024 * 1024


def _check_no_server_error(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.request.url, response.status_code)


async def _no_server_error(response: httpx.Response) -> None:
    _check_no_server_error(response)


def _client(**overrides: Any) -> httpx.AsyncClient:
    """The app over a FakeEngine, addressed as http://127.0.0.1 unless a test sets Host itself."""
    app = create_app(settings(**overrides), FakeEngine())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1",
                             event_hooks={"response": [_no_server_error]})


async def _call(c: httpx.AsyncClient, method: str, path: str, host: str | None = None) -> httpx.Response:
    """`method path` (a valid chat body for POST), with `Host: host` when given."""
    headers = {"Host": host} if host else {}
    return await c.request(method, path, json=chat_body() if method == "POST" else None, headers=headers)


def _assert_error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response is an OpenAI-shaped error with `status` and `code`; returns the error object."""
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    return error


def _nested(levels: int) -> Any:
    """An object nested `levels` deep: {"k": {"k": ... 1}}."""
    value: Any = 1
    for _ in range(levels):
        value = {"k": value}
    return value


# DNS-rebinding guard


async def test_foreign_host_is_421_everywhere():
    """A page that rebound its own name to 127.0.0.1 gets 421 on every route, /health included."""
    async with _client() as c:
        for host in FOREIGN_HOSTS:
            for method, path in ROUTES:
                error = _assert_error(await _call(c, method, path, host), 421, "host_not_allowed")
                name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
                assert f"--allowed-hosts {name}" in error["message"], error


async def test_local_hosts_pass():
    """localhost, 127.0.0.1 and [::1] (any port, any case, any 127/8 address) are served."""
    async with _client() as c:
        for host in LOCAL_HOSTS:
            for method, path in ROUTES:
                assert (await _call(c, method, path, host)).status_code == 200, (host, path)


async def test_allowed_hosts_admit_a_name():
    """--allowed-hosts adds names (a port in the list is ignored); others still get 421."""
    async with _client(allowed_hosts=["my-box.lan", "Other.LAN:9000"]) as c:
        assert (await _call(c, "POST", CHAT, "my-box.lan:8000")).status_code == 200
        assert (await _call(c, "GET", "/health", "other.lan")).status_code == 200
        assert (await _call(c, "GET", "/health", "localhost:8000")).status_code == 200
        _assert_error(await _call(c, "GET", "/health", "evil.example"), 421, "host_not_allowed")


@pytest.mark.parametrize(("bind", "allowed", "guarded"), [
    ("127.0.0.1", [], True), ("localhost", [], True), ("::1", [], True), ("127.0.0.5", [], True),
    ("0.0.0.0", [], False), ("::", [], False), ("0.0.0.0", ["my-box.lan"], True), ("127.0.0.1", ["*"], False),
])
async def test_guard_follows_the_bind(bind, allowed, guarded):
    """On for a loopback bind; off for 0.0.0.0 unless --allowed-hosts is given; `*` turns it off."""
    async with _client(host=bind, allowed_hosts=allowed) as c:
        r = await _call(c, "GET", "/health", "evil.example")
        assert r.status_code == (421 if guarded else 200), r.text
        assert (await _call(c, "GET", "/health", "127.0.0.1:8000")).status_code == 200


async def test_missing_host_is_421():
    """A request without any Host header (HTTP/1.0 style) is refused when the guard is on."""
    app = create_app(settings(), FakeEngine())
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.0", "method": "GET", "scheme": "http",
             "path": "/health", "raw_path": b"/health", "query_string": b"", "root_path": "", "headers": [],
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1)}
    await app(scope, receive, send)
    assert sent[0]["status"] == 421
    assert json.loads(sent[1]["body"])["error"]["code"] == "host_not_allowed"


# Content type


@pytest.mark.parametrize("content_type", [
    "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=xyz", "application/jsonp", "", None,
])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_non_json_bodies_are_415(path, content_type):
    """Bodies a page can send cross-site without a preflight are refused before parsing, even valid JSON."""
    body = chat_body() if path == CHAT else {"model": "fake-model", "prompt": "hi"}
    headers = {} if content_type is None else {"Content-Type": content_type}
    async with _client() as c:
        r = await c.post(path, content=json.dumps(body).encode(), headers=headers)
    assert content_type is not None or "content-type" not in r.request.headers
    error = _assert_error(r, 415, "unsupported_media_type")
    assert "Content-Type: application/json" in error["message"]


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON", " application/json "])
async def test_json_content_types_pass(content_type):
    """The JSON media type passes in any case and with parameters."""
    async with _client() as c:
        r = await c.post(CHAT, content=json.dumps(chat_body()).encode(), headers={"Content-Type": content_type})
    assert r.status_code == 200, r.text


async def test_multipart_upload_is_415():
    """A real multipart form (what an HTML form posts) is refused."""
    async with _client() as c:
        r = await c.post(CHAT, data={"model": "fake-model"}, files={"file": ("a.json", b"{}")})
    assert r.request.headers["content-type"].startswith("multipart/form-data")
    _assert_error(r, 415, "unsupported_media_type")


# Nesting


@pytest.mark.parametrize("raw", [
    b"[" * 100_000, b'{"a":' * 100_000, b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 100_000 + b"1" + b"}" * 100_000, json.dumps(_nested(MAX_JSON_DEPTH + 1)).encode(),
], ids=["arrays-100k", "objects-100k", "closed-arrays-100k", "closed-objects-100k", "objects-65"])
async def test_deep_nesting_is_400(raw):
    """Nesting past MAX_JSON_DEPTH is a clear 400 invalid_json, however deep, never a 500."""
    async with _client(max_body_bytes=BIG_BODIES) as c:
        r = await c.post(CHAT, content=raw, headers={"Content-Type": "application/json"})
        error = _assert_error(r, 400, "invalid_json")
        assert "nested too deeply" in error["message"] and str(MAX_JSON_DEPTH) in error["message"]
        assert (await c.post(CHAT, json=chat_body())).status_code == 200


async def test_nesting_at_the_limit_passes():
    """A body exactly MAX_JSON_DEPTH deep is served; one level more is refused."""
    levels_below_body = MAX_JSON_DEPTH - 1  # the body object itself is the first level
    async with _client() as c:
        ok = await c.post(CHAT, json=chat_body(chat_template_kwargs=_nested(levels_below_body)))
        deep = await c.post(CHAT, json=chat_body(chat_template_kwargs=_nested(levels_below_body + 1)))
    assert ok.status_code == 200, ok.text
    _assert_error(deep, 400, "invalid_json")


# CORS


def _preflight(origin: str, host: str | None = None) -> dict[str, str]:
    headers = {"Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": SDK_HEADERS}
    return headers | ({"Host": host} if host else {})


async def test_preflight_from_allowed_origin_passes_key_and_type_checks():
    """The OpenAI JS SDK's preflight succeeds from an allowed origin, though it carries no key or body."""
    async with _client(allowed_origins=[APP_ORIGIN], api_key=KEY) as c:
        pre = await c.options(CHAT, headers=_preflight(APP_ORIGIN))
        post = await c.post(CHAT, json=chat_body(), headers={"Origin": APP_ORIGIN, "Authorization": f"Bearer {KEY}"})
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == APP_ORIGIN
    allowed = {h.strip().lower() for h in pre.headers["access-control-allow-headers"].split(",")}
    assert {h.strip() for h in SDK_HEADERS.split(",")} <= allowed
    assert post.status_code == 200 and post.headers["access-control-allow-origin"] == APP_ORIGIN
    exposed = {h.strip().lower() for h in post.headers["access-control-expose-headers"].split(",")}
    assert "retry-after" in exposed


async def test_preflight_from_foreign_origin_fails():
    """Another origin's preflight is refused and gets no CORS grant."""
    async with _client(allowed_origins=[APP_ORIGIN], api_key=KEY) as c:
        pre = await c.options(CHAT, headers=_preflight("http://evil.example"))
    assert pre.status_code == 400 and "access-control-allow-origin" not in pre.headers


async def test_preflight_under_a_foreign_host_is_421():
    """The host guard sits outside CORS: even an allowed origin's preflight is refused under a rebound name."""
    async with _client(allowed_origins=[APP_ORIGIN]) as c:
        pre = await c.options(CHAT, headers=_preflight(APP_ORIGIN, host="evil.example:8000"))
    _assert_error(pre, 421, "host_not_allowed")
    assert "access-control-allow-origin" not in pre.headers


# Settings


def test_allowed_hosts_setting(monkeypatch):
    """Default empty; comma-separated from DSPARK_ALLOWED_HOSTS; the --allowed-hosts flag wins."""
    monkeypatch.delenv("DSPARK_ALLOWED_HOSTS", raising=False)
    assert ServerSettings().allowed_hosts == []
    monkeypatch.setenv("DSPARK_ALLOWED_HOSTS", "a.lan, b.lan")
    assert ServerSettings().allowed_hosts == ["a.lan", "b.lan"]
    args = build_parser().parse_args(["serve", "--allowed-hosts", "c.lan,*"])
    assert settings_from_args(args).allowed_hosts == ["c.lan", "*"]


# Through the real server


def test_real_server_on_loopback():
    """Under uvicorn on 127.0.0.1: rebinding Host 421, local Hosts pass, non-JSON 415, deep nesting 400."""
    hooks = {"response": [_check_no_server_error]}
    with live_server(FakeEngine(), max_body_bytes=BIG_BODIES) as live, \
            httpx.Client(base_url=live.base_url, timeout=10, event_hooks=hooks) as c:
        port = live.base_url.rsplit(":", 1)[1]
        for method, path in ROUTES:
            body = chat_body() if method == "POST" else None
            r = c.request(method, path, json=body, headers={"Host": f"evil.example:{port}"})
            _assert_error(r, 421, "host_not_allowed")
            for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
                assert c.request(method, path, json=body, headers={"Host": host}).status_code == 200, (host, path)
        r = c.post(CHAT, content=json.dumps(chat_body()).encode(), headers={"Content-Type": "text/plain"})
        _assert_error(r, 415, "unsupported_media_type")
        r = c.post(CHAT, content=b'{"a":' * 100_000, headers={"Content-Type": "application/json"})
        _assert_error(r, 400, "invalid_json")
