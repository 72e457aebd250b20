"""Streaming chat completions: SSE framing exactly as OpenAI sends it."""

from __future__ import annotations

import pytest

from engine.api import EngineDead, EngineError
from server.app import create_app
from tests.server.conftest import CHAT, chat_body, settings, sse_data, sse_frames
from tests.server.fake_engine import FakeEngine, Script

pytestmark = pytest.mark.anyio


def _app(script: Script, **overrides):
    engine = FakeEngine(lambda request: script)
    return engine, create_app(settings(**overrides), engine)


async def _post(app, body):
    import httpx

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        return await c.post(CHAT, json=body)


async def test_frame_sequence_with_usage(client, engine):
    """Role chunk, one delta per round, finish chunk, separate usage chunk with choices [], then [DONE]."""
    r = await client.post(CHAT, json=chat_body(stream=True, stream_options={"include_usage": True}))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.text.endswith("data: [DONE]\n\n")
    events = sse_data(r.text)
    role, *deltas, finish, usage, done = events
    assert done == "[DONE]"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [d["choices"][0]["delta"] for d in deltas][:2] == [{"content": "Hel"}, {"content": "lo"}]
    assert "".join(d["choices"][0]["delta"]["content"] for d in deltas).startswith("Hello #")
    assert finish["choices"][0]["finish_reason"] == "stop" and finish["choices"][0]["delta"] == {}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + usage["usage"]["completion_tokens"]
    assert all(e["usage"] is None for e in [role, *deltas, finish])
    ids = {e["id"] for e in events[:-1]}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    assert {e["object"] for e in events[:-1]} == {"chat.completion.chunk"}
    assert {e["model"] for e in events[:-1]} == {"fake-model"}


async def test_no_usage_chunk_without_include_usage(client):
    """Without stream_options.include_usage there is no usage chunk and no usage field."""
    r = await client.post(CHAT, json=chat_body(stream=True))
    events = sse_data(r.text)
    assert events[-1] == "[DONE]"
    assert all("usage" not in e for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


async def test_finish_chunk_carries_dspark_stats():
    """The finish chunk carries dspark_stats (mode, cap, accepted length, tokens/s); others do not."""
    _, app = _app(Script(rounds=["a", "bb"]))
    events = sse_data((await _post(app, chat_body(stream=True))).text)
    finish = events[-2]
    stats = finish["dspark_stats"]
    assert stats["mode"] == "dspark" and stats["cap"] == 4 and stats["rounds"] == 2
    assert {"mean_accepted_length", "tokens_per_s", "acceptance_by_position"} <= stats.keys()
    assert all("dspark_stats" not in e for e in events[:-2])


async def test_length_finish_and_trailing_text():
    """Finished.text is emitted as a last delta and finish_reason 'length' is passed through."""
    _, app = _app(Script(rounds=["a"], reason="length", final_text="Z"))
    events = sse_data((await _post(app, chat_body(stream=True))).text)
    assert [e["choices"][0]["delta"].get("content") for e in events[1:-2]] == ["a", "Z"]
    assert events[-2]["choices"][0]["finish_reason"] == "length"


async def test_empty_round_text_sends_no_chunk():
    """A round whose text is held back (empty) produces no empty content chunk."""
    _, app = _app(Script(rounds=["a", "", "b"]))
    events = sse_data((await _post(app, chat_body(stream=True))).text)
    assert [e["choices"][0]["delta"]["content"] for e in events[1:-2]] == ["a", "b"]


async def test_keepalive_comments_during_slow_prefill_and_between_rounds():
    """Keep-alive comments flow on a wall-clock timer while the first event is slow and between rounds."""
    _, app = _app(Script(rounds=["a", "b"], first_delay_s=0.3, round_delay_s=0.3), keepalive_s=0.05)
    frames = sse_frames((await _post(app, chat_body(stream=True))).text)
    first_data = next(i for i, f in enumerate(frames) if f.startswith("data: ") and '"content":"a"' in f)
    second_data = next(i for i, f in enumerate(frames) if '"content":"b"' in f)
    before = [f for f in frames[1:first_data] if f.startswith(":")]
    between = [f for f in frames[first_data + 1:second_data] if f.startswith(":")]
    assert len(before) >= 3 and len(between) >= 3
    assert frames[0].startswith("data: ")  # the role chunk goes out at once
    assert set(before) == {": keep-alive"}


async def test_error_mid_stream_is_one_event_then_close():
    """An engine failure after the stream started is one sanitized error event, then close, no [DONE]."""
    _, app = _app(Script(rounds=["a", "b"], fail_after=1))
    r = await _post(app, chat_body(stream=True))
    assert r.status_code == 200
    events = sse_data(r.text)
    assert "[DONE]" not in events
    error = events[-1]["error"]
    assert error["type"] == "server_error" and error["code"] == "engine_error"
    assert "/secret/path" not in error["message"]
    assert events[-2]["choices"][0]["delta"]["content"] == "a"


async def test_engine_death_mid_stream_is_unavailable_event():
    """An EngineDead raised mid-stream becomes a 503-typed error event."""
    _, app = _app(Script(rounds=["a", "b"], fail_after=1, fail_with=EngineDead("worker thread died")))
    events = sse_data((await _post(app, chat_body(stream=True))).text)
    assert events[-1]["error"]["code"] == "engine_dead"
    assert events[-1]["error"]["type"] == "service_unavailable_error"


async def test_next_request_succeeds_after_engine_failure():
    """After a request fails inside the engine, the next request still succeeds."""
    calls = []

    def script(request):
        calls.append(request)
        return Script(rounds=["x"], fail_after=0, fail_with=EngineError("boom")) if len(calls) == 1 else Script()

    app = create_app(settings(), FakeEngine(script))
    assert "error" in sse_data((await _post(app, chat_body(stream=True))).text)[-1]
    r = await _post(app, chat_body())
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hello, world"


async def test_sse_headers_disable_buffering(client):
    """Streams are sent uncached and unbuffered for proxies."""
    r = await client.post(CHAT, json=chat_body(stream=True))
    assert r.headers["cache-control"] == "no-cache" and r.headers["x-accel-buffering"] == "no"
