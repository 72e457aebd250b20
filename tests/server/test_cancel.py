"""Cancellation: a client that goes away frees the engine, streaming or not, running or queued."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from server.app import create_app
from tests.server.conftest import CHAT, AsgiCall, chat_body, settings, wait_until
from tests.server.fake_engine import FakeEngine, Script

pytestmark = pytest.mark.anyio

# Endless for a test (about 30 min): a request that is not freed blocks every later one.
LONG = Script(rounds=["tok"] * 100_000, round_delay_s=0.02)
PROBE_HANG_S = 60.0  # only a hang guard: a freed engine answers the probe at once


def long_unless_probe(request) -> Script:
    """Long generations, except for the probe request."""
    return Script() if b"probe" in bytes(request.prompt_ids) else LONG


async def _probe(app) -> None:
    """A follow-up request completes; behind a request that was not freed it would wait for LONG."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        r = await asyncio.wait_for(c.post(CHAT, json=chat_body("probe")), PROBE_HANG_S)
    assert r.status_code == 200


async def test_disconnect_mid_stream_cancels():
    """Disconnecting mid-stream cancels the engine request at once; the next request runs promptly."""
    engine = FakeEngine(long_unless_probe)
    app = create_app(settings(), engine)
    call = AsgiCall(app, CHAT, chat_body(stream=True)).start()
    await wait_until(lambda: call.body.count('"content":"tok"') >= 2)
    call.disconnect.set()
    await call.finish(1.0)
    assert engine.cancelled == [engine.submitted[0].request_id] and engine.finished == []
    await _probe(app)


async def test_disconnect_during_prefill_cancels():
    """Disconnecting while the first token is still being computed (prefill) cancels the request."""
    engine = FakeEngine(lambda r: Script(rounds=["a"], first_delay_s=5.0))
    app = create_app(settings(keepalive_s=10.0), engine)
    call = AsgiCall(app, CHAT, chat_body(stream=True)).start()
    await wait_until(lambda: len(engine.submitted) == 1)
    call.disconnect.set()
    await call.finish(1.0)
    assert engine.cancelled == [engine.submitted[0].request_id]


async def test_disconnect_while_queued_cancels():
    """A streaming request that disconnects while queued leaves the queue and is cancelled."""
    engine = FakeEngine(long_unless_probe)
    app = create_app(settings(), engine)
    running = AsgiCall(app, CHAT, chat_body(stream=True)).start()
    await wait_until(lambda: '"content":"tok"' in running.body)
    queued = AsgiCall(app, CHAT, chat_body("second", stream=True)).start()
    await wait_until(lambda: engine.queue_depth() == 1)
    queued.disconnect.set()
    await queued.finish(1.0)
    assert engine.cancelled == [engine.submitted[1].request_id] and engine.queue_depth() == 0
    running.disconnect.set()
    await running.finish(1.0)
    await _probe(app)


async def test_non_streaming_disconnect_cancels():
    """A non-streaming client that disconnects is noticed while the engine works and cancelled."""
    engine = FakeEngine(long_unless_probe)
    app = create_app(settings(), engine)
    call = AsgiCall(app, CHAT, chat_body()).start()
    await wait_until(lambda: len(engine.submitted) == 1)
    await asyncio.sleep(0.05)
    call.disconnect.set()
    await call.finish(1.0)
    assert engine.cancelled == [engine.submitted[0].request_id] and engine.finished == []
    await _probe(app)


async def test_non_streaming_disconnect_while_queued_cancels():
    """A non-streaming request that disconnects while queued is removed from the queue."""
    engine = FakeEngine(long_unless_probe)
    app = create_app(settings(), engine)
    running = AsgiCall(app, CHAT, chat_body()).start()
    await wait_until(lambda: len(engine.submitted) == 1)
    queued = AsgiCall(app, CHAT, chat_body("second")).start()
    await wait_until(lambda: engine.queue_depth() == 1)
    queued.disconnect.set()
    await queued.finish(1.0)
    assert engine.cancelled == [engine.submitted[1].request_id] and engine.queue_depth() == 0
    running.disconnect.set()
    await running.finish(1.0)


async def test_handler_cancellation_cancels():
    """If the request task itself is cancelled (server shutdown), the engine request is cancelled."""
    engine = FakeEngine(long_unless_probe)
    app = create_app(settings(), engine)
    call = AsgiCall(app, CHAT, chat_body()).start()
    await wait_until(lambda: len(engine.submitted) == 1)
    assert call.task is not None
    call.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call.task
    assert engine.cancelled == [engine.submitted[0].request_id]


async def test_completed_stream_is_not_cancelled(client, engine):
    """A stream that ran to the end is not cancelled afterwards."""
    await client.post(CHAT, json=chat_body(stream=True))
    assert engine.cancelled == [] and len(engine.finished) == 1


async def test_drain_deadline_interrupts_non_streaming_request():
    """A non-streaming request still running when the drain grace ends gets 503 and is cancelled."""
    engine = FakeEngine(long_unless_probe)
    app = create_app(settings(drain_grace_s=0.1), engine)
    call = AsgiCall(app, CHAT, chat_body()).start()
    await wait_until(lambda: len(engine.submitted) == 1)
    app.state.app_state.drain.begin()
    await call.finish(1.0)
    assert call.status == 503 and '"server_shutting_down"' in call.body
    assert engine.cancelled == [engine.submitted[0].request_id]


async def test_client_gone_while_uploading_is_not_a_server_error():
    """A client that disconnects during the body upload is counted as cancelled, not as a 500."""
    engine = FakeEngine()
    app = create_app(settings(), engine)
    sent: list[dict] = []

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": CHAT, "raw_path": CHAT.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")],
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1)}
    await app(scope, receive, send)
    assert sent[0]["status"] == 499 and engine.submitted == []
