"""Non-streaming chat completions and how request fields reach the engine."""

from __future__ import annotations

import pytest

from tests.server.conftest import CHAT, chat_body

pytestmark = pytest.mark.anyio


async def test_response_shape(client):
    """A non-streaming reply has OpenAI's shape, usage and the dspark_stats extension."""
    r = await client.post(CHAT, json=chat_body())
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "fake-model"
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop" and choice["logprobs"] is None
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"].startswith("Hello #")
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert body["dspark_stats"]["mode"] == "dspark" and body["dspark_stats"]["cap"] == 4


async def test_sampling_fields_reach_the_engine(client, engine):
    """temperature, top_p, top_k, min_p, seed, stop, max_tokens and dspark.sampler map onto the request."""
    body = chat_body(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, seed=7, stop=["\n", "END"], max_tokens=12,
                     dspark={"sampler": "seed-stable"})
    assert (await client.post(CHAT, json=body)).status_code == 200
    request = engine.submitted[-1]
    s = request.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed, s.sampler) == (0.7, 0.9, 40, 0.05, 7, "seed-stable")
    assert request.stop == ("\n", "END") and request.max_tokens == 12


async def test_defaults(client, engine):
    """Defaults: OpenAI's temperature 1.0, server sampler, and max_tokens = the rest of the context."""
    assert (await client.post(CHAT, json=chat_body())).status_code == 200
    request = engine.submitted[-1]
    assert request.sampling.temperature == 1.0 and request.sampling.sampler is None
    assert request.sampling.top_k == 0 and request.sampling.top_p == 1.0 and request.sampling.seed is None
    assert request.max_tokens == 256 - len(request.prompt_ids)
    assert request.stop == ()


async def test_single_stop_string_and_top_k_off(client, engine):
    """A string `stop` becomes one stop string; vLLM's top_k -1 means off (0)."""
    assert (await client.post(CHAT, json=chat_body(stop="###", top_k=-1))).status_code == 200
    assert engine.submitted[-1].stop == ("###",) and engine.submitted[-1].sampling.top_k == 0


async def test_max_completion_tokens(client, engine):
    """max_completion_tokens is the same limit as max_tokens."""
    assert (await client.post(CHAT, json=chat_body(max_completion_tokens=3))).status_code == 200
    assert engine.submitted[-1].max_tokens == 3


async def test_roles_parts_and_template_kwargs(client, engine):
    """All five roles pass; text parts are joined; developer is system; chat_template_kwargs pass through."""
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "user", "content": "q", "name": "ann"},
        {"role": "assistant", "content": "r"},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]
    body = {"model": "fake-model", "messages": messages, "chat_template_kwargs": {"enable_thinking": False}}
    assert (await client.post(CHAT, json=body)).status_code == 200
    sent, kwargs = engine.encoded[-1]
    assert sent == [
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "a\nb"},
        {"role": "user", "content": "q", "name": "ann"},
        {"role": "assistant", "content": "r"},
        {"role": "user", "content": "<tool_response>\n42\n</tool_response>"},  # no template: the Hermes form
    ]
    assert kwargs == {"enable_thinking": False}


async def test_neutral_values_of_unsupported_fields_are_accepted(client):
    """OpenAI fields at their no-op values (n=1, tools=[], logprobs=false, penalties 0, ...) are accepted."""
    body = chat_body(n=1, tools=[], tool_choice="none", logprobs=False, presence_penalty=0, frequency_penalty=0.0,
                     response_format={"type": "text"}, user="u-1", logit_bias={}, parallel_tool_calls=True,
                     store=False, stream=False, seed=None, stop=None)
    r = await client.post(CHAT, json=body)
    assert r.status_code == 200, r.text


async def test_model_aliases(client):
    """The served id and the documented alias 'default' are accepted; the reply names the served id."""
    for name in ("fake-model", "default"):
        r = await client.post(CHAT, json={**chat_body(), "model": name})
        assert r.status_code == 200 and r.json()["model"] == "fake-model"


async def test_identical_concurrent_requests_identical_outputs(client, engine):
    """n identical concurrent requests get identical outputs, and different prompts do not cross."""
    import asyncio

    same = [client.post(CHAT, json=chat_body("same", temperature=0)) for _ in range(6)]
    other = [client.post(CHAT, json=chat_body(f"p{i}", temperature=0)) for i in range(3)]
    replies = await asyncio.gather(*same, *other)
    texts = [r.json()["choices"][0]["message"]["content"] for r in replies]
    assert len(set(texts[:6])) == 1
    assert len(set(texts[6:])) == 3 and texts[0] not in texts[6:]
