"""End to end on the real engine and default model: `dspark serve` in a subprocess, driven over HTTP.

Greedy text through the server equals `dspark generate`'s for the same prompt and mode; streaming,
identical concurrent requests, a disconnect that frees the worker, and the SIGTERM drain.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.real_server import ServeProcess, clean_env
from tests.server.conftest import free_port

pytestmark = pytest.mark.slow

PROMPT = "What is the capital of France?"
MAX_TOKENS = 24


@pytest.fixture
def served(default_server) -> ServeProcess:
    """The real server over the embedded default model, in its default mode (shared by the run)."""
    return default_server


def _client(served: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(client: openai.OpenAI, **extra) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(model="default", messages=[{"role": "user", "content": PROMPT}],
                                          temperature=0, max_tokens=MAX_TOKENS, **extra)


def test_ready_health_says_what_is_served(served):
    """/health reports the effective mode and the ready line is printed with the URL."""
    assert served.health["state"] == "ready" and served.health["mode"] in ("dspark", "dflash", "baseline")
    assert any(f"{served.base_url}/v1" in line and "ready" in line for line in served.output)


def test_greedy_text_equals_dspark_generate(served):
    """Greedy text through the server equals `dspark generate --json` for the same prompt and mode."""
    reply = _chat(_client(served))
    cli = subprocess.run([sys.executable, "-m", "dspark_cli.main", "generate", "--json", "--prompt", PROMPT,
                          "--max-tokens", str(MAX_TOKENS), "--mode", served.health["mode"]],
                         capture_output=True, text=True, timeout=300, check=True, env=clean_env())
    expected = json.loads(cli.stdout.strip().splitlines()[-1])
    assert reply.choices[0].message.content == expected["text"]
    assert reply.usage.completion_tokens == len(expected["tokens"])
    assert reply.model_extra["dspark_stats"]["mode"] == served.health["mode"]


def test_stream_and_concurrent_requests_agree(served):
    """Streamed text equals the non-streamed text, and identical concurrent greedy requests agree."""
    client = _client(served)
    baseline = _chat(client).choices[0].message.content
    chunks = list(_chat(client, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == baseline
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(_chat(client).choices[0].message.content))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [baseline] * 3


def test_async_sdk_streaming_matches(served):
    """The async OpenAI SDK, streaming and not, returns the same greedy text as the sync SDK."""
    import asyncio

    expected = _chat(_client(served)).choices[0].message.content

    async def main() -> tuple[str, str]:
        client = openai.AsyncOpenAI(base_url=f"{served.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        args = {"model": "default", "messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
                "max_tokens": MAX_TOKENS}
        whole = (await client.chat.completions.create(**args)).choices[0].message.content
        parts = [c.choices[0].delta.content or "" async for c in await client.chat.completions.create(
            **args, stream=True) if c.choices]
        await client.close()
        return whole, "".join(parts)

    whole, streamed = asyncio.run(main())
    assert whole == streamed == expected


def test_raw_sse_framing(served):
    """Raw SSE from the real server: role chunk, content deltas, finish chunk, usage chunk, [DONE]."""
    body = {"model": "default", "messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
            "max_tokens": MAX_TOKENS, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{served.base_url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        frames = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""} or \
        chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == _chat(_client(served)).choices[0].message.content
    assert len({c["id"] for c in chunks}) == 1


def test_disconnect_frees_the_worker(served):
    """A long stream whose client disconnects stops; a probe request then completes promptly."""
    body = json.dumps({"model": "default", "stream": True, "max_tokens": 4000, "temperature": 0.7,
                       "messages": [{"role": "user", "content": "Write a very long story about a dragon."}]}).encode()
    port = int(served.base_url.rsplit(":", 1)[1])
    before = _cancelled_streams(served)  # the server is shared: count from here
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while received.count(b'"content"') < 3:
        received += sock.recv(65536)
    sock.close()
    # The server counts the stream as cancelled once the engine has let it go (no clock involved).
    deadline = time.monotonic() + 120  # a hang guard only
    while _cancelled_streams(served) < before + 1:
        assert time.monotonic() < deadline, "the disconnected stream was never cancelled"
        time.sleep(0.05)
    probe = _client(served).chat.completions.create(model="default", max_tokens=4, temperature=0,
                                                    messages=[{"role": "user", "content": "Hi"}])
    assert probe.choices[0].message.content


def _cancelled_streams(served: ServeProcess) -> float:
    """dspark_requests_total{outcome="cancelled"} summed over endpoints, from /metrics."""
    text = httpx.get(f"{served.base_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("dspark_requests_total{") and 'outcome="cancelled"' in line)


@pytest.fixture
def own_server(default_model_dir) -> Iterator[ServeProcess]:
    """A server of its own, for a test that stops it (the module's shared one must outlive it)."""
    server = ServeProcess(free_port())
    try:
        server.health = server.wait_ready()
        yield server
    finally:
        server.stop()


def test_sigterm_drains_then_exits(own_server):
    """On SIGTERM an in-flight stream ends with its finish chunk and [DONE], and the process exits."""
    served = own_server
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        body = {"model": "default", "stream": True, "max_tokens": 48, "temperature": 0,
                "messages": [{"role": "user", "content": PROMPT}]}
        with httpx.Client(timeout=120) as c, c.stream("POST", f"{served.base_url}/v1/chat/completions",
                                                      json=body) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    started.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(60)
    served.proc.send_signal(signal.SIGTERM)
    reader.join(60)
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")
    served.proc.wait(30)


def test_second_turn_restores_the_first_from_the_prefix_cache(served):
    """A second turn that resends the first exchange reports most of its prompt as cached, and the
    cache shows in /health and /metrics (the server's prefix cache is on by default)."""
    client = _client(served)
    system = "You are a terse assistant. " * 20
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Name a prime number."}]
    first = client.chat.completions.create(model="default", messages=messages, temperature=0, max_tokens=12)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And another one?"}]
    second = client.chat.completions.create(model="default", messages=messages, temperature=0, max_tokens=12)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 0.8 * second.usage.prompt_tokens and cached >= first.usage.prompt_tokens
    health = httpx.get(f"{served.base_url}/health", timeout=10).json()
    assert health["prefix_cache"]["entries"] >= 1 and health["prefix_cache"]["hit_tokens"] >= cached
    metrics = httpx.get(f"{served.base_url}/metrics", timeout=10).text
    hits = [line for line in metrics.splitlines() if line.startswith("dspark_prefix_cache_hit_tokens_total ")]
    assert hits and float(hits[0].split()[1]) >= cached


def test_an_image_to_the_text_only_default_model_is_a_clear_4xx(served):
    """The default model has no vision tower: an image part is refused with a 400 that says so."""
    import base64

    url = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                             {"type": "image_url", "image_url": {"url": url}}]}]
    with pytest.raises(openai.BadRequestError) as err:
        _client(served).chat.completions.create(model="default", messages=messages, max_tokens=4)
    assert "image" in str(err.value).lower()
