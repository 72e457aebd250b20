"""The real app under uvicorn on loopback: the openai SDK, real socket disconnects, SIGTERM drain."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import httpx
import openai
import pytest

from engine.api import EngineError
from tests.server.conftest import CHAT, chat_body, live_server, wait_until_sync
from tests.server.fake_engine import FakeEngine, Script

pytestmark = pytest.mark.anyio


# Rounds in a generation that outlasts any test: only a cancel or a drain ends it, so a test that
# passes cannot have been helped by the generation finishing on its own.
ENDLESS = 100_000
HANG_S = 60.0  # hang guard: a wait this long is a failure, never a slow machine


def _script(request) -> Script:
    """Long for prompts saying 'long', failing for 'fail', else the short default."""
    prompt = bytes(request.prompt_ids)
    if b"long" in prompt:
        return Script(rounds=["tok"] * ENDLESS, round_delay_s=0.02)
    if b"fail" in prompt:
        return Script(rounds=["a", "b"], fail_after=1, fail_with=EngineError("boom"))
    return Script(rounds=["Hello", ",", " world"])


@pytest.fixture(scope="module")
def live():
    """One live server over a FakeEngine for the module."""
    engine = FakeEngine(_script)
    with live_server(engine) as server:
        server.engine = engine
        yield server


def _sdk(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="unused", max_retries=0, timeout=10)


def test_sdk_chat_non_stream(live):
    """The openai SDK gets a parsed chat completion, with dspark_stats as an extra field."""
    reply = _sdk(live).chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                                temperature=0, seed=3, max_tokens=20)
    assert reply.choices[0].message.content == "Hello, world" and reply.choices[0].finish_reason == "stop"
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.model_extra["dspark_stats"]["mode"] == "dspark"


def test_sdk_chat_stream_with_usage(live):
    """SDK streaming with include_usage: content deltas, a finish reason, then a usage chunk with no choices."""
    stream = _sdk(live).chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello, world"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_sdk_errors(live):
    """SDK errors: 400 -> BadRequestError naming the field; unknown model -> NotFoundError model_not_found."""
    client = _sdk(live)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}], n=2)
    assert bad.value.code == "unsupported_parameter" and bad.value.param == "n"
    assert "'n' is not supported" in bad.value.message
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.code == "model_not_found" and "gpt-4o" in missing.value.message
    reply = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], extra_body={"frobnicate": 1})
    assert reply.headers["x-dspark-ignored"] == "frobnicate" and reply.parse().choices  # tolerated, reported


def test_sdk_error_mid_stream(live):
    """An engine failure mid-stream surfaces in the SDK as an APIError, and the next request succeeds."""
    client = _sdk(live)
    stream = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "fail"}],
                                             stream=True)
    with pytest.raises(openai.APIError):
        list(stream)
    assert client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}]).choices


def test_sdk_models_and_completions(live):
    """models.list/retrieve and the legacy completions endpoint work through the SDK."""
    client = _sdk(live)
    assert [m.id for m in client.models.list()] == ["fake-model"]
    assert client.models.retrieve("fake-model").id == "fake-model"
    assert client.completions.create(model="fake-model", prompt="Once", max_tokens=5).choices[0].text == "Hello, world"


async def test_async_sdk_stream(live):
    """The async SDK streams the same text."""
    client = openai.AsyncOpenAI(base_url=f"{live.base_url}/v1", api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(model="fake-model", stream=True,
                                                   messages=[{"role": "user", "content": "hi"}])
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    await client.close()
    assert text == "Hello, world"


def test_raw_sse_framing(live):
    """Over the wire the frames are exactly `data: {json}` / `data: [DONE]`, blank-line separated."""
    with httpx.Client(base_url=live.base_url) as c:
        raw = c.post(CHAT, json=chat_body(stream=True, stream_options={"include_usage": True})).text
    frames = raw.split("\n\n")
    assert frames[-1] == "" and frames[-2] == "data: [DONE]"
    assert all(f.startswith("data: {") for f in frames[:-2])
    assert json.loads(frames[-3][6:])["choices"] == []


def _open_request(live, body: dict) -> socket.socket:
    raw = json.dumps(body).encode()
    port = int(live.base_url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw)
    return sock


def _probe(live) -> None:
    """A follow-up request completes: behind a request that still held the worker it would hang."""
    with httpx.Client(base_url=live.base_url, timeout=HANG_S) as c:
        assert c.post(CHAT, json=chat_body("probe")).status_code == 200


def test_socket_close_mid_stream_cancels(live):
    """Closing the TCP connection mid-stream cancels the engine request; a probe then completes promptly."""
    engine = live.engine
    sock = _open_request(live, chat_body("long", stream=True))
    received = b""
    while received.count(b'"content":"tok"') < 2:
        received += sock.recv(65536)
    before = len(engine.cancelled)
    sock.close()
    wait_until_sync(lambda: len(engine.cancelled) == before + 1)
    _probe(live)


def test_socket_close_non_stream_cancels(live):
    """Closing the connection of a non-streaming request cancels it in the engine."""
    engine = live.engine
    submitted = len(engine.submitted)
    sock = _open_request(live, chat_body("long"))
    wait_until_sync(lambda: len(engine.submitted) == submitted + 1)
    time.sleep(0.05)
    before = len(engine.cancelled)
    sock.close()
    wait_until_sync(lambda: len(engine.cancelled) == before + 1)
    assert engine.submitted[-1].request_id not in engine.finished
    _probe(live)


def _stream_lines(base_url: str, body: dict, lines: list[str], first: threading.Event) -> None:
    with httpx.Client(base_url=base_url, timeout=10) as c, c.stream("POST", CHAT, json=body) as r:
        for line in r.iter_lines():
            if line:
                lines.append(line)
            if '"content"' in line:
                first.set()


def _sigterm_during_stream(script: Script, grace: float) -> tuple[list[str], FakeEngine]:
    """SIGTERM while `script` streams; the server must have exited within the hang guard."""
    engine = FakeEngine(lambda r: script)
    with live_server(engine, drain_grace_s=grace) as live:
        lines: list[str] = []
        first = threading.Event()
        reader = threading.Thread(target=_stream_lines, args=(live.base_url, chat_body(stream=True), lines, first))
        reader.start()
        assert first.wait(HANG_S)
        live.server.handle_exit(signal.SIGTERM, None)
        reader.join(HANG_S)
        live.thread.join(HANG_S)
        assert not live.thread.is_alive()
    return lines, engine


def test_sigterm_drains_in_flight_stream():
    """On SIGTERM an in-flight stream still gets its finish chunk and [DONE], then the process exits
    as soon as it is drained: the grace outlasts the hang guard, so waiting it out would fail."""
    lines, engine = _sigterm_during_stream(Script(rounds=["a"] * 10, round_delay_s=0.05), grace=10 * HANG_S)
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "stop"
    assert engine.cancelled == []


def test_sigterm_grace_expiry_ends_stream_with_error():
    """A stream still running when the grace period ends gets one shutdown error event, and is
    cancelled: the stream is endless, so only the grace expiry can have ended it."""
    lines, engine = _sigterm_during_stream(Script(rounds=["a"] * ENDLESS, round_delay_s=0.02), grace=0.3)
    assert "data: [DONE]" not in lines
    assert json.loads(lines[-1][6:])["error"]["code"] == "server_shutting_down"
    assert len(engine.cancelled) == 1


def test_new_requests_refused_while_draining():
    """After SIGTERM new connections are refused or answered 503, never served."""
    engine = FakeEngine(lambda r: Script(rounds=["a"] * 40, round_delay_s=0.05))
    with live_server(engine, drain_grace_s=5.0) as live:
        lines: list[str] = []
        first = threading.Event()
        reader = threading.Thread(target=_stream_lines, args=(live.base_url, chat_body(stream=True), lines, first))
        reader.start()
        assert first.wait(5)
        live.server.handle_exit(signal.SIGTERM, None)
        time.sleep(0.3)
        try:
            status = httpx.post(f"{live.base_url}{CHAT}", json=chat_body(), timeout=2).status_code
        except httpx.TransportError:
            status = None
        assert status in (None, 503)
        reader.join(10)
        assert lines[-1] == "data: [DONE]"
