"""The Anthropic Messages API over the fake engine: request conversion, the reply and its event
sequence, count_tokens, Anthropic's error envelope on every kind of refusal, and x-api-key.
(The real model with the official `anthropic` SDK: test_messages_real.py.)"""

from __future__ import annotations

import json

import httpx
import pytest

from server.app import create_app
from server.errors import APIError
from server.messages.convert import chat_request
from server.messages.protocol import MessagesRequest
from tests.server.conftest import settings, sse_frames
from tests.server.fake_engine import FakeEngine, Script

pytestmark = pytest.mark.anyio

MESSAGES = "/v1/messages"
WEATHER = {"name": "get_weather", "description": "Weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def body(**extra):
    return {"model": "fake-model", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **extra}


def convert(**extra):
    return chat_request(MessagesRequest.model_validate(body(**extra)))


def test_conversion_of_a_tool_round_trip():
    """system blocks, text blocks, tool_use -> tool_calls, tool_result -> tool messages, thinking."""
    chat = convert(system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
                   tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True},
                   stop_sequences=["END"], temperature=0, messages=[
                       {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
                       {"role": "assistant", "content": [
                           {"type": "thinking", "thinking": "Use the tool.", "signature": "x"},
                           {"type": "text", "text": "Let me check."},
                           {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
                       {"role": "user", "content": [
                           {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "5 C"}]},
                           {"type": "text", "text": "Thanks"}]}])
    m = [x.model_dump(exclude_none=True) for x in chat.messages]
    assert [(x["role"], _text(x)) for x in m] == [("system", "Be brief.\nBe kind."), ("user", "Weather?"),
                                                  ("assistant", "Let me check."), ("tool", "5 C"), ("user", "Thanks")]
    assert m[2]["reasoning_content"] == "Use the tool." and m[2]["tool_calls"][0]["id"] == "toolu_1"
    assert json.loads(m[2]["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}
    assert m[3]["tool_call_id"] == "toolu_1"
    assert chat.forced_tool_choice == "required" and chat.parallel_tool_calls is False
    assert chat.tool_defs[0].function.parameters == WEATHER["input_schema"]
    assert chat.stop == ["END"] and chat.temperature == 0 and chat.max_tokens == 16


def _text(message: dict) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else "".join(part["text"] for part in content or [])


def test_conversion_of_choices_thinking_and_output_format():
    assert convert(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}).forced_tool_choice == \
        "get_weather"
    assert convert(tools=[WEATHER], tool_choice={"type": "none"}).tool_defs == []
    assert convert(thinking={"type": "disabled"}).reasoning_effort == "none"
    assert convert(thinking={"type": "enabled", "budget_tokens": 1024}).chat_template_kwargs.enable_thinking is True
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = convert(output_config={"format": {"type": "json_schema", "schema": schema}}).response_format
    assert fmt == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


@pytest.mark.parametrize("extra,param", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].source"),
    ({"messages": [{"role": "assistant", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages[0].content[0]"),
    ({"tools": [{"name": "web", "type": "web_search_20250305"}]}, "tools[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}]},
     "messages[0].content[0]"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
])
def test_refused_blocks_name_the_place(extra, param):
    with pytest.raises(APIError) as info:
        convert(**extra)
    assert info.value.status == 400 and info.value.param == param


async def test_message_reply(client):
    r = await client.post(MESSAGES, json=body(stop_sequences=["zzz"]))
    assert r.status_code == 200
    msg = r.json()
    assert msg["type"] == "message" and msg["role"] == "assistant" and msg["id"].startswith("msg_")
    assert msg["content"] == [{"type": "text", "text": msg["content"][0]["text"]}]
    assert msg["content"][0]["text"].startswith("Hello #") and msg["stop_reason"] == "end_turn"
    assert msg["usage"]["input_tokens"] > 0 and msg["usage"]["output_tokens"] > 0 and "dspark_stats" in msg


async def test_stop_reasons():
    engine = FakeEngine(script=lambda request: Script(rounds=["a", "b"], reason="length"))
    async with _client(engine) as c:
        assert (await c.post(MESSAGES, json=body())).json()["stop_reason"] == "max_tokens"


async def test_stream_event_sequence(client):
    """message_start, ping, one text block (start, deltas, stop), message_delta, message_stop; every frame
    is named by its type and nothing follows the last one."""
    r = await client.post(MESSAGES, json=body(stream=True))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in sse_frames(r.text) if not f.startswith(":")]
    events = []
    for frame in frames:
        name, data = frame.split("\n", 1)
        payload = json.loads(data.removeprefix("data: "))
        assert name == f"event: {payload['type']}"
        events.append(payload)
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"] and kinds[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    reply = (await client.post(MESSAGES, json=body())).json()
    assert text == reply["content"][0]["text"] and events[-2]["delta"]["stop_reason"] == "end_turn"
    assert events[0]["message"]["usage"]["input_tokens"] == reply["usage"]["input_tokens"]


async def test_count_tokens(client):
    r = await client.post(MESSAGES + "/count_tokens", json={"model": "fake-model", "messages": [
        {"role": "user", "content": "hi"}], "system": "Be brief."})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


@pytest.mark.parametrize("payload,status,kind", [
    ({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error"),
    (body(model="claude-sonnet-4-5"), 404, "not_found_error"),
    (body(max_tokens=0), 400, "invalid_request_error"),
])
async def test_errors_use_anthropics_envelope(client, payload, status, kind):
    r = await client.post(MESSAGES, json=payload)
    assert r.status_code == status
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == kind and error["error"]["message"]


async def test_x_api_key_and_its_401():
    async with _client(FakeEngine(), api_key="sk-test") as c:
        missing = await c.post(MESSAGES, json=body())
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
        assert (await c.post(MESSAGES, json=body(), headers={"x-api-key": "wrong"})).status_code == 401
        assert (await c.post(MESSAGES, json=body(), headers={"x-api-key": "sk-test"})).status_code == 200
        assert (await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                             headers={"x-api-key": "sk-test"})).status_code == 200
        chat_401 = await c.post("/v1/chat/completions", json={"messages": []})
        assert chat_401.json()["error"]["code"] == "invalid_api_key"  # OpenAI's shape off /v1/messages


def _client(engine, **overrides) -> httpx.AsyncClient:
    app = create_app(settings(**overrides), engine)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


async def test_agent_sized_prompt_gets_a_clear_context_error(client):
    """A system prompt beyond the context window (agent CLIs send 9-20 K tokens): a 400 that says so."""
    r = await client.post(MESSAGES, json=body(system="You are a coding agent. " * 2000))
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "maximum context length" in error["message"]


async def test_metrics_count_the_messages_endpoint(client):
    await client.post(MESSAGES, json=body())
    await client.post(MESSAGES, json=body(max_tokens=0))
    text = (await client.get("/metrics")).text
    assert 'dspark_requests_total{endpoint="messages",outcome="ok"} 1.0' in text
    assert 'dspark_requests_total{endpoint="messages",outcome="invalid"} 1.0' in text
