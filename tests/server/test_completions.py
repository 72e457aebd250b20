"""POST /v1/completions: text completions, streamed and not."""

from __future__ import annotations

import pytest

from tests.server.conftest import COMPLETIONS, sse_data

pytestmark = pytest.mark.anyio


async def test_text_completion(client, engine):
    """A string prompt is encoded without a chat template and answered as a text_completion."""
    r = await client.post(COMPLETIONS, json={"model": "fake-model", "prompt": "Once", "max_tokens": 5})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"].startswith("Hello #") and body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] == 4 and "dspark_stats" in body
    assert engine.submitted[-1].prompt_ids == tuple(b"Once") and engine.encoded == []


async def test_token_id_prompts(client, engine):
    """Token-id prompts (flat, or one nested list) and a one-string list are accepted."""
    for prompt, ids in (([5, 6, 7], (5, 6, 7)), ([[8, 9]], (8, 9)), (["ab"], tuple(b"ab"))):
        r = await client.post(COMPLETIONS, json={"model": "fake-model", "prompt": prompt})
        assert r.status_code == 200, r.text
        assert engine.submitted[-1].prompt_ids == ids


async def test_streamed_text_completion(client):
    """Streamed text completions: text chunks, a finish chunk, the usage chunk, [DONE]; no role chunk."""
    body = {"model": "fake-model", "prompt": "x", "stream": True, "stream_options": {"include_usage": True}}
    events = sse_data((await client.post(COMPLETIONS, json=body)).text)
    *texts, finish, usage, done = events
    assert done == "[DONE]" and usage["choices"] == [] and usage["usage"]["prompt_tokens"] == 1
    assert [t["choices"][0]["text"] for t in texts][:2] == ["Hel", "lo"]
    assert finish["choices"][0]["finish_reason"] == "stop" and finish["dspark_stats"]["mode"] == "dspark"
    assert {e["object"] for e in events[:-1]} == {"text_completion"}
