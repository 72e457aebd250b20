"""Admission: the queue bound (429 + Retry-After), loading / dead / draining (503), /health, /v1/models."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from engine.api import EngineInputError
from server.app import create_app
from tests.server.conftest import CHAT, chat_body, settings, sse_frames, wait_until
from tests.server.fake_engine import FakeEngine, Script

pytestmark = pytest.mark.anyio


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


async def test_queue_full_is_429_with_retry_after():
    """Past the queue bound a request gets 429 rate_limit_error with a Retry-After in seconds."""
    engine = FakeEngine(lambda r: Script(rounds=["a"], first_delay_s=0.3), max_queue=1)
    async with _client(create_app(settings(), engine)) as c:
        running = asyncio.ensure_future(c.post(CHAT, json=chat_body()))
        await wait_until(lambda: len(engine.submitted) == 1 and engine.queue_depth() == 0)
        queued = asyncio.ensure_future(c.post(CHAT, json=chat_body()))
        await wait_until(lambda: engine.queue_depth() == 1)
        r = await c.post(CHAT, json=chat_body())
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error" and r.json()["error"]["code"] == "overloaded"
        assert (await running).status_code == 200 and (await queued).status_code == 200
        assert (await c.post(CHAT, json=chat_body())).status_code == 200


async def test_queue_position_visible_in_health_and_keepalives():
    """While queued, /health shows the queue depth and the stream's keep-alives show the position."""
    # The first request must still be running when /health is read: 0.4 s was too short once, in a
    # CI run whose other worker was busy with the SmolLM2 tests.
    engine = FakeEngine(lambda r: Script(rounds=["a"], first_delay_s=2.0))
    async with _client(create_app(settings(keepalive_s=0.05), engine)) as c:
        running = asyncio.ensure_future(c.post(CHAT, json=chat_body()))
        await wait_until(lambda: len(engine.submitted) == 1)
        queued = asyncio.ensure_future(c.post(CHAT, json=chat_body(stream=True)))
        await wait_until(lambda: engine.queue_depth() == 1)
        health = (await c.get("/health")).json()
        assert health["queue_depth"] == 1 and health["max_queue"] == 16
        await running
        frames = sse_frames((await queued).text)
        assert ": queued position=1" in frames


async def test_health_ready():
    """/health is 200 when ready and reports the effective mode, cap, drafter and sampler."""
    async with _client(create_app(settings(), FakeEngine())) as c:
        r = await c.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["state"] == "ready"
    assert (body["mode"], body["cap"], body["drafter"], body["sampler"]) == ("dspark", 4, "fake-drafter", "rejection")
    assert body["queue_depth"] == 0 and body["context_length"] == 256 and body["draining"] is False


async def test_loading_is_503_with_retry_after():
    """While loading, /health is 503 and requests get 503 engine_loading with Retry-After; then it turns ready."""
    engine = FakeEngine(state="loading")
    async with _client(create_app(settings(mode="dflash"), engine)) as c:
        health = await c.get("/health")
        assert health.status_code == 503
        assert health.json()["status"] == "loading" and health.json()["mode"] == "dflash"
        assert health.json()["cap"] is None
        r = await c.post(CHAT, json=chat_body())
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_loading"
        assert r.json()["error"]["type"] == "service_unavailable_error" and int(r.headers["retry-after"]) > 0
        assert (await c.get("/v1/models")).status_code == 503
        engine.set_state("ready")
        assert (await c.get("/health")).status_code == 200
        assert (await c.post(CHAT, json=chat_body())).status_code == 200


async def test_dead_is_503_with_reason():
    """A dead engine gives /health 503 with the reason, and requests 503 engine_dead."""
    engine = FakeEngine(state="dead")
    async with _client(create_app(settings(), engine)) as c:
        health = await c.get("/health")
        r = await c.post(CHAT, json=chat_body())
    assert health.status_code == 503 and health.json()["status"] == "dead"
    assert "out of memory" in health.json()["dead_reason"]
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
    assert "out of memory" in r.json()["error"]["message"]


async def test_draining_refuses_new_requests():
    """Once draining, /health is 503 and new requests get 503 server_shutting_down."""
    app = create_app(settings(), FakeEngine())
    app.state.app_state.drain.begin()
    async with _client(app) as c:
        health = await c.get("/health")
        r = await c.post(CHAT, json=chat_body())
    assert health.status_code == 503 and health.json()["status"] == "draining"
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down"


async def test_submit_input_error_is_400_with_param():
    """An EngineInputError raised by submit() is a 400 naming the engine's param, before any stream."""
    engine = FakeEngine(submit_error=EngineInputError("token id 99999 is outside the vocabulary", param="prompt"))
    async with _client(create_app(settings(), engine)) as c:
        r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": [99999], "stream": True})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"] == {"message": "token id 99999 is outside the vocabulary",
                                 "type": "invalid_request_error", "param": "prompt", "code": "invalid_request"}


async def test_models_list_and_retrieve(client):
    """/v1/models lists the served model with drafter, mode and cap; retrieve works; unknown ids are 404."""
    listing = (await client.get("/v1/models")).json()
    assert listing["object"] == "list" and [m["id"] for m in listing["data"]] == ["fake-model"]
    card = listing["data"][0]
    assert card["object"] == "model" and card["owned_by"] == "dspark-serve"
    assert card["dspark"]["drafter"] == "fake-drafter" and card["dspark"]["mode"] == "dspark"
    assert card["dspark"]["cap"] == 4 and card["dspark"]["aliases"] == ["default"]
    assert (await client.get("/v1/models/fake-model")).json()["id"] == "fake-model"
    missing = await client.get("/v1/models/org/other")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


async def test_health_responds_during_long_generation():
    """/health is answered while a generation streams (the stream is endless: it is still running)."""
    engine = FakeEngine(lambda r: Script(rounds=["a"] * 100_000, round_delay_s=0.02))
    async with _client(create_app(settings(), engine)) as c:
        long = asyncio.ensure_future(c.post(CHAT, json=chat_body(stream=True)))
        await wait_until(lambda: len(engine.submitted) == 1)
        for _ in range(5):
            assert (await asyncio.wait_for(c.get("/health"), 60)).status_code == 200
        assert not long.done() and engine.finished == []
        long.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await long
