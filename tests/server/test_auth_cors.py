"""API key (Bearer) on every route but /health; CORS only with allowed origins."""

from __future__ import annotations

import httpx
import pytest

from server.app import create_app
from tests.server.conftest import CHAT, chat_body, settings
from tests.server.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio

KEY = "sk-local-test"


def _client(**overrides) -> httpx.AsyncClient:
    app = create_app(settings(**overrides), FakeEngine())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


async def test_missing_key_is_401():
    """Without a key, /v1 routes, /metrics and the schema answer 401 invalid_api_key (OpenAI-shaped)."""
    async with _client(api_key=KEY) as c:
        for method, path in (("POST", CHAT), ("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/openapi.json")):
            r = await c.request(method, path, json=chat_body() if method == "POST" else None)
            assert r.status_code == 401, path
            error = r.json()["error"]
            assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
            assert r.headers["www-authenticate"] == "Bearer"


async def test_wrong_key_is_401():
    """A wrong key (or a non-Bearer scheme) is refused."""
    async with _client(api_key=KEY) as c:
        wrong = await c.post(CHAT, json=chat_body(), headers={"Authorization": "Bearer nope"})
        basic = await c.post(CHAT, json=chat_body(), headers={"Authorization": f"Basic {KEY}"})
    assert wrong.status_code == 401 and wrong.json()["error"]["message"] == "Incorrect API key provided."
    assert basic.status_code == 401


async def test_right_key_and_open_health():
    """The right key is served; /health needs no key."""
    async with _client(api_key=KEY) as c:
        ok = await c.post(CHAT, json=chat_body(), headers={"Authorization": f"Bearer {KEY}"})
        health = await c.get("/health")
    assert ok.status_code == 200 and health.status_code == 200


async def test_no_key_configured_means_open():
    """Without --api-key nothing asks for a key."""
    async with _client() as c:
        assert (await c.get("/v1/models")).status_code == 200


async def test_cors_off_by_default():
    """No CORS headers unless origins are allowed."""
    async with _client() as c:
        r = await c.get("/health", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in r.headers


async def test_cors_allowed_origin():
    """An allowed origin gets CORS headers and a preflight answer, even with an API key."""
    async with _client(allowed_origins=["http://app.example"], api_key=KEY) as c:
        pre = await c.options(CHAT, headers={"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                                             "Access-Control-Request-Headers": "authorization,content-type"})
        r = await c.get("/v1/models", headers={"Origin": "http://app.example"})
        other = await c.get("/health", headers={"Origin": "http://evil.example"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://app.example"
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "http://app.example"
    assert "access-control-allow-origin" not in other.headers
