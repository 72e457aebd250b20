"""The one per-request queue of `EngineClient`: `next_event` timeouts, `interrupt`, `stream`, and
`wait_ready` (also through the app's lifespan), on the real worker over a gated tiny target."""

from __future__ import annotations

import asyncio
import threading

import pytest

from engine.api import EngineConfig, Finished, TokenEvent
from engine.client import EngineClient
from server.app import create_app
from tests.server.conftest import settings
from tests.server.fake_engine import INFO, FakeEngine
from tests.server.scripted_worker import (
    assert_stopped_by_cancel, gated_target, make_client, make_runtime, request,
)

pytestmark = pytest.mark.anyio


class Gone(Exception):
    """A stand-in for what the server interrupts a request with."""


@pytest.fixture
async def target_and_client():
    """A started client over a gated target; released and shut down afterwards."""
    target = gated_target()
    client = make_client(target)
    client.start()
    assert await client.wait_ready() == "ready"
    try:
        yield target, client
    finally:
        target.release.set()
        await client.shutdown()


async def _drain(client, handle) -> list:
    events = []
    while not events or not isinstance(events[-1], Finished):
        events.append(await client.next_event(handle))
    return events


async def test_next_event_timeout_returns_none_and_keeps_the_request(target_and_client):
    """A timeout with nothing queued is None and does not cancel; the events then arrive in order."""
    target, client = target_and_client
    target.hold_at = 1
    handle = client.submit(request(max_tokens=3))
    await asyncio.to_thread(target.held.wait, 10)
    assert await client.next_event(handle, timeout=0.01) is None
    assert await client.next_event(handle, timeout=0.0) is None
    assert not handle.job.cancelled.is_set()
    target.release.set()
    events = await _drain(client, handle)
    assert all(isinstance(e, TokenEvent) for e in events[:-1]) and events[-1].usage.completion_tokens == 3
    assert handle.finished and not handle.job.cancelled.is_set()


async def test_interrupt_raises_after_the_queued_events_and_cancels(target_and_client):
    """An interrupt comes out after the events already delivered, raises, and cancels the request."""
    target, client = target_and_client
    target.hold_at = 2  # the prefill's event is posted, then the worker holds in the first round
    handle = client.submit(request(max_tokens=20))
    await asyncio.to_thread(target.held.wait, 10)  # the sink's post was scheduled before this wake-up
    client.interrupt(handle, Gone())
    assert isinstance(await client.next_event(handle, timeout=5), TokenEvent)
    with pytest.raises(Gone):
        await client.next_event(handle, timeout=5)
    assert handle.job.cancelled.is_set()
    target.release.set()
    assert isinstance((await _drain(client, client.submit(request(max_tokens=2))))[-1], Finished)
    assert_stopped_by_cancel(handle)


async def test_interrupt_from_another_thread(target_and_client):
    """`interrupt` called off the event loop is handed to the loop and still raises in next_event."""
    target, client = target_and_client
    target.hold_at = 1
    handle = client.submit(request(max_tokens=20))
    await asyncio.to_thread(target.held.wait, 10)
    await asyncio.to_thread(client.interrupt, handle, Gone())
    with pytest.raises(Gone):
        await client.next_event(handle)
    assert handle.job.cancelled.is_set()


async def test_cancelling_the_waiting_task_cancels_the_request(target_and_client):
    """A task cancelled while it waits in next_event cancels the engine request."""
    target, client = target_and_client
    target.hold_at = 1
    handle = client.submit(request(max_tokens=20))
    await asyncio.to_thread(target.held.wait, 10)
    waiter = asyncio.ensure_future(client.next_event(handle))
    await asyncio.sleep(0)  # let it start waiting
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert handle.job.cancelled.is_set()


async def test_stream_closed_early_cancels_and_a_full_stream_does_not(target_and_client):
    """`stream()` still yields everything; closing it before the Finished cancels the request."""
    _, client = target_and_client
    whole = client.submit(request(max_tokens=3))
    events = [e async for e in client.stream(whole)]
    assert isinstance(events[-1], Finished) and not whole.job.cancelled.is_set()
    early = client.submit(request(max_tokens=20))
    stream = client.stream(early)
    assert isinstance(await stream.__anext__(), TokenEvent)
    await stream.aclose()
    assert early.job.cancelled.is_set()


async def test_wait_ready_wakes_when_loading_ends():
    """`wait_ready` waits for the worker's state callback: "ready", or "dead" after a failed load."""
    loaded = threading.Event()
    runtime = make_runtime(gated_target())
    states: list[str] = []

    def slow_factory(config):
        loaded.wait(10)
        return runtime

    client = EngineClient(EngineConfig(), runtime_factory=slow_factory, on_state=states.append)
    client.start()
    waiter = asyncio.ensure_future(client.wait_ready())
    await asyncio.sleep(0)
    assert not waiter.done() and client.state == "loading"
    loaded.set()
    assert await asyncio.wait_for(waiter, 10) == "ready" and states == ["ready"]
    await client.shutdown()

    def broken(config):
        raise FileNotFoundError("no such model")

    dead = EngineClient(EngineConfig(), runtime_factory=broken)
    dead.start()
    assert await asyncio.wait_for(dead.wait_ready(), 10) == "dead" and "no such model" in dead.dead_reason


async def test_lifespan_announces_ready_without_polling():
    """The app's lifespan calls on_ready once the injected engine leaves "loading" (set from a thread)."""
    engine = FakeEngine(state="loading")
    announced: asyncio.Queue = asyncio.Queue()
    app = create_app(settings(), engine, on_ready=announced.put_nowait)
    async with app.router.lifespan_context(app):
        await asyncio.sleep(0)
        assert announced.empty()
        await asyncio.to_thread(engine.set_state, "ready")
        assert await asyncio.wait_for(announced.get(), 10) == INFO
