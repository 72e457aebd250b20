"""A client that disconnects frees the real engine: while queued behind another request, during its
prefill, and mid-stream. Each time the request is cancelled in the worker, the next request runs,
the metrics count the outcome, no 5xx is sent and nothing hangs.

The app runs over the real `EngineClient` and `EngineWorker` (tests/server/scripted_worker.py); the
worker is held inside a chosen forward with threading Events, so each disconnect lands exactly where
the test says.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from server.app import create_app
from tests.server.conftest import COMPLETIONS, AsgiCall, settings, sse_data
from tests.server.scripted_worker import assert_stopped_by_cancel, completion_body, gated_target, make_client
from tests.server.test_metrics import _get, _scrape

pytestmark = pytest.mark.anyio

HANG_GUARD_S = 10.0  # only against a hang: nothing below depends on timing


@pytest.fixture
async def served():
    """(app, client, target): the app over a started real client; released and shut down afterwards."""
    target = gated_target()
    client = make_client(target)
    client.start()
    assert await client.wait_ready() == "ready"
    app = create_app(settings(keepalive_s=10.0), client)
    try:
        yield app, client, target
    finally:
        target.release.set()
        await client.shutdown()


async def _held(target) -> None:
    """Wait until the worker is inside the held forward."""
    assert await asyncio.to_thread(target.held.wait, HANG_GUARD_S)


async def _next_request_completes(app) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1",
                                 timeout=HANG_GUARD_S) as c:
        r = await c.post(COMPLETIONS, json=completion_body(max_tokens=2))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


async def _outcomes(app) -> dict[str, float]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        samples = await _scrape(c)
    assert _get(samples, "dspark_requests_running") == 0
    outcomes = ("ok", "cancelled", "error", "interrupted", "unavailable")
    counts = {o: _get(samples, "dspark_requests_total", endpoint="completions", outcome=o) for o in outcomes}
    return {o: n for o, n in counts.items() if n}


def _not_a_server_error(call: AsgiCall, stream: bool) -> None:
    if stream:  # a stream still silent when its client leaves sends nothing at all
        assert call.status in (None, 200) and '"error"' not in call.body
    else:
        assert call.status == 499 and '"client_closed_request"' in call.body


@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect_while_queued(served, stream):
    """Queued behind a running request: cancelled, never started, and the queue moves on."""
    app, client, target = served
    target.hold_at = 1  # the first request's prefill holds the worker
    running = AsgiCall(app, COMPLETIONS, completion_body(max_tokens=4)).start()
    await client.handles.get()
    await _held(target)
    queued = AsgiCall(app, COMPLETIONS, completion_body(max_tokens=4, stream=stream)).start()
    handle = await client.handles.get()
    assert handle.queue_position == 1
    queued.disconnect.set()
    await queued.finish(HANG_GUARD_S)
    assert handle.job.cancelled.is_set() and client.queue_depth() == 0
    _not_a_server_error(queued, stream)
    target.release.set()
    await running.finish(HANG_GUARD_S)
    assert running.status == 200
    await _next_request_completes(app)
    assert not handle.job.started.is_set()  # the worker skipped it on its way to the next one
    assert await _outcomes(app) == {"ok": 2, "cancelled": 1}


@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect_during_prefill(served, stream):
    """Gone while its prompt is prefilled: cancelled, and stopped at the end of that forward."""
    app, client, target = served
    target.hold_at = 1
    call = AsgiCall(app, COMPLETIONS, completion_body(max_tokens=40, stream=stream)).start()
    handle = await client.handles.get()
    await _held(target)
    call.disconnect.set()
    await call.finish(HANG_GUARD_S)
    assert handle.job.cancelled.is_set()
    _not_a_server_error(call, stream)
    target.release.set()
    await _next_request_completes(app)
    assert_stopped_by_cancel(handle)
    assert await _outcomes(app) == {"ok": 1, "cancelled": 1}


async def test_disconnect_mid_stream(served):
    """Gone after text was streamed: cancelled within a round, no [DONE], the next request runs."""
    app, client, target = served
    target.hold_at = 2  # the prefill's text is streamed, then the worker holds in the first round
    call = AsgiCall(app, COMPLETIONS, completion_body(max_tokens=40, stream=True)).start()
    handle = await client.handles.get()
    await _held(target)
    await call.wait_sent(lambda c: any(d != "[DONE]" and d["choices"][0]["text"] for d in sse_data(c.body)),
                         HANG_GUARD_S)
    call.disconnect.set()
    await call.finish(HANG_GUARD_S)
    assert handle.job.cancelled.is_set() and not handle.finished
    assert call.status == 200 and "[DONE]" not in call.body and '"error"' not in call.body
    target.release.set()
    await _next_request_completes(app)
    assert_stopped_by_cancel(handle)
    assert await _outcomes(app) == {"ok": 1, "cancelled": 1}
