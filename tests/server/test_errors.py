"""The error table: every malformed or unsupported request gets the right OpenAI-shaped error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.server.conftest import CHAT, COMPLETIONS, chat_body

pytestmark = pytest.mark.anyio

MSG = [{"role": "user", "content": "hi"}]
BAD = "invalid_request_error"


def chat(**fields: Any) -> dict[str, Any]:
    return chat_body(**fields)


def raw(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode()


# (id, method, path, body (dict -> JSON, bytes -> as is), status, type, param, code)
CASES: list[tuple[str, str, str, Any, int, str, str | None, str | None]] = [
    ("malformed-json", "POST", CHAT, raw('{"model": '), 400, BAD, None, "invalid_json"),
    ("empty-body", "POST", CHAT, raw(""), 400, BAD, None, "invalid_json"),
    ("array-body", "POST", CHAT, raw("[1, 2]"), 400, BAD, None, "invalid_body"),
    ("string-body", "POST", CHAT, raw('"hello"'), 400, BAD, None, "invalid_body"),
    ("null-body", "POST", CHAT, raw("null"), 400, BAD, None, "invalid_body"),
    ("nan-literal", "POST", CHAT, raw('{"model": "fake-model", "messages": [], "temperature": NaN}'), 400, BAD, None,
     "invalid_json"),
    ("infinity-literal", "POST", CHAT, raw('{"model": "m", "top_p": -Infinity}'), 400, BAD, None, "invalid_json"),
    ("overflow-to-inf", "POST", CHAT, raw(json.dumps(chat())[:-1] + ', "temperature": 1e999}'), 400, BAD,
     "temperature", "invalid_value"),
    ("not-utf8", "POST", CHAT, b'{"model": "\xff\xfe"}', 400, BAD, None, "invalid_json"),
    ("max-tokens-string", "POST", CHAT, chat(max_tokens="5"), 400, BAD, "max_tokens", "invalid_type"),
    ("max-tokens-bool", "POST", CHAT, chat(max_tokens=True), 400, BAD, "max_tokens", "invalid_type"),
    ("max-tokens-float", "POST", CHAT, chat(max_tokens=5.0), 400, BAD, "max_tokens", "invalid_type"),
    ("max-tokens-zero", "POST", CHAT, chat(max_tokens=0), 400, BAD, "max_tokens", "invalid_value"),
    ("max-tokens-negative", "POST", CHAT, chat(max_tokens=-3), 400, BAD, "max_tokens", "invalid_value"),
    ("max-tokens-disagree", "POST", CHAT, chat(max_tokens=3, max_completion_tokens=4), 400, BAD,
     "max_completion_tokens", "invalid_value"),
    ("temperature-high", "POST", CHAT, chat(temperature=2.5), 400, BAD, "temperature", "invalid_value"),
    ("temperature-negative", "POST", CHAT, chat(temperature=-0.1), 400, BAD, "temperature", "invalid_value"),
    ("temperature-string", "POST", CHAT, chat(temperature="hot"), 400, BAD, "temperature", "invalid_type"),
    ("temperature-bool", "POST", CHAT, chat(temperature=True), 400, BAD, "temperature", "invalid_type"),
    ("top-p-high", "POST", CHAT, chat(top_p=1.5), 400, BAD, "top_p", "invalid_value"),
    ("top-k-below", "POST", CHAT, chat(top_k=-2), 400, BAD, "top_k", "invalid_value"),
    ("min-p-high", "POST", CHAT, chat(min_p=2), 400, BAD, "min_p", "invalid_value"),
    ("seed-too-big", "POST", CHAT, chat(seed=2**64), 400, BAD, "seed", "invalid_value"),
    ("seed-float", "POST", CHAT, chat(seed=1.5), 400, BAD, "seed", "invalid_type"),
    ("stream-string", "POST", CHAT, chat(stream="true"), 400, BAD, "stream", "invalid_type"),
    ("stream-int", "POST", CHAT, chat(stream=1), 400, BAD, "stream", "invalid_type"),
    ("stream-options-without-stream", "POST", CHAT, chat(stream_options={"include_usage": True}), 400, BAD,
     "stream_options", "invalid_value"),
    ("stream-options-bad-type", "POST", CHAT, chat(stream=True, stream_options={"include_usage": "yes"}), 400, BAD,
     "stream_options.include_usage", "invalid_type"),
    ("stream-options-unknown", "POST", CHAT, chat(stream=True, stream_options={"continuous": True}), 400, BAD,
     "stream_options.continuous", "unrecognized_argument"),
    ("too-many-stops", "POST", CHAT, chat(stop=["a", "b", "c", "d", "e"]), 400, BAD, "stop", "invalid_value"),
    ("stop-int", "POST", CHAT, chat(stop=7), 400, BAD, "stop", "invalid_type"),
    ("stop-empty-string", "POST", CHAT, chat(stop=["ok", ""]), 400, BAD, "stop[1]", "invalid_value"),
    ("stop-list-of-int", "POST", CHAT, chat(stop=[1]), 400, BAD, "stop[0]", "invalid_type"),
    ("n-two", "POST", CHAT, chat(n=2), 400, BAD, "n", "unsupported_parameter"),
    ("n-string", "POST", CHAT, chat(n="1"), 400, BAD, "n", "invalid_type"),
    ("tools", "POST", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, BAD, "tools",
     "unsupported_parameter"),
    ("tool-choice", "POST", CHAT, chat(tool_choice="auto"), 400, BAD, "tool_choice", "unsupported_parameter"),
    ("functions", "POST", CHAT, chat(functions=[{"name": "f"}]), 400, BAD, "functions", "unsupported_parameter"),
    ("response-format-json", "POST", CHAT, chat(response_format={"type": "json_object"}), 400, BAD,
     "response_format", "unsupported_parameter"),
    ("logprobs", "POST", CHAT, chat(logprobs=True), 400, BAD, "logprobs", "unsupported_parameter"),
    ("top-logprobs", "POST", CHAT, chat(top_logprobs=2), 400, BAD, "top_logprobs", "unsupported_parameter"),
    ("logit-bias", "POST", CHAT, chat(logit_bias={"42": 5}), 400, BAD, "logit_bias", "unsupported_parameter"),
    ("presence-penalty", "POST", CHAT, chat(presence_penalty=0.5), 400, BAD, "presence_penalty",
     "unsupported_parameter"),
    ("frequency-penalty-range", "POST", CHAT, chat(frequency_penalty=3), 400, BAD, "frequency_penalty",
     "invalid_value"),
    ("store-true", "POST", CHAT, chat(store=True), 400, BAD, "store", "unsupported_parameter"),
    ("known-unsupported-field", "POST", CHAT, chat(reasoning_effort="high"), 400, BAD, "reasoning_effort",
     "unsupported_parameter"),
    ("unknown-field", "POST", CHAT, chat(frobnicate=1), 400, BAD, "frobnicate", "unrecognized_argument"),
    ("missing-model", "POST", CHAT, {"messages": MSG}, 400, BAD, "model", "missing_required_parameter"),
    ("missing-messages", "POST", CHAT, {"model": "fake-model"}, 400, BAD, "messages", "missing_required_parameter"),
    ("model-not-string", "POST", CHAT, {"model": 4, "messages": MSG}, 400, BAD, "model", "invalid_type"),
    ("empty-messages", "POST", CHAT, {"model": "fake-model", "messages": []}, 400, BAD, "messages", "invalid_value"),
    ("messages-string", "POST", CHAT, {"model": "fake-model", "messages": "hi"}, 400, BAD, "messages",
     "invalid_type"),
    ("bad-role", "POST", CHAT, {"model": "fake-model", "messages": [{"role": "bot", "content": "x"}]}, 400, BAD,
     "messages[0].role", "invalid_value"),
    ("image-part", "POST", CHAT, {"model": "fake-model", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}]}, 400, BAD,
     "messages[0].content[1]", "unsupported_parameter"),
    ("null-content", "POST", CHAT, {"model": "fake-model", "messages": [{"role": "user", "content": None}]}, 400,
     BAD, "messages[0].content", "invalid_type"),
    ("message-unknown-key", "POST", CHAT, {"model": "fake-model", "messages": [
        {"role": "user", "content": "x", "mood": "happy"}]}, 400, BAD, "messages[0].mood", "unrecognized_argument"),
    ("assistant-tool-calls", "POST", CHAT, {"model": "fake-model", "messages": [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}]}, 400, BAD, "messages[0].tool_calls",
     "unsupported_parameter"),
    ("template-kwargs-type", "POST", CHAT, chat(chat_template_kwargs="x"), 400, BAD, "chat_template_kwargs",
     "invalid_type"),
    ("dspark-bad-sampler", "POST", CHAT, chat(dspark={"sampler": "greedy"}), 400, BAD, "dspark.sampler",
     "invalid_value"),
    ("dspark-unknown", "POST", CHAT, chat(dspark={"turbo": True}), 400, BAD, "dspark.turbo",
     "unrecognized_argument"),
    ("unknown-model", "POST", CHAT, {**chat(), "model": "gpt-4o"}, 404, BAD, "model", "model_not_found"),
    ("context-max-tokens", "POST", CHAT, chat(max_tokens=10_000), 400, BAD, "max_tokens",
     "context_length_exceeded"),
    ("context-long-prompt", "POST", CHAT, chat_body("x" * 400), 400, BAD, "max_tokens", "context_length_exceeded"),
    ("engine-input-error", "POST", CHAT, chat_body("nul\x00here"), 400, BAD, "messages", "invalid_request"),
    ("oversized-body", "POST", CHAT, chat_body("y" * 70_000), 413, BAD, None, "request_too_large"),
    ("unknown-route", "POST", "/v1/embeddings", chat(), 404, BAD, None, "not_found"),
    ("wrong-method", "GET", CHAT, None, 405, BAD, None, "method_not_allowed"),
    ("completions-batch", "POST", COMPLETIONS, {"model": "fake-model", "prompt": ["a", "b"]}, 400, BAD, "prompt",
     "unsupported_parameter"),
    ("completions-prompt-type", "POST", COMPLETIONS, {"model": "fake-model", "prompt": 5}, 400, BAD, "prompt",
     "invalid_type"),
    ("completions-echo", "POST", COMPLETIONS, {"model": "fake-model", "prompt": "a", "echo": True}, 400, BAD, "echo",
     "unsupported_parameter"),
    ("completions-best-of", "POST", COMPLETIONS, {"model": "fake-model", "prompt": "a", "best_of": 3}, 400, BAD,
     "best_of", "unsupported_parameter"),
    ("completions-suffix", "POST", COMPLETIONS, {"model": "fake-model", "prompt": "a", "suffix": "z"}, 400, BAD,
     "suffix", "unsupported_parameter"),
    ("completions-messages", "POST", COMPLETIONS, {"model": "fake-model", "prompt": "a", "messages": MSG}, 400, BAD,
     "messages", "unrecognized_argument"),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "type_", "param", "code"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
async def test_error_table(client, method, path, body, status, type_, param, code):
    """Each bad request gets its status and an OpenAI error (type, param, code); the server stays healthy."""
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    r = await client.request(method, path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"}
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["type"], error["param"], error["code"]) == (type_, param, code), error
    assert (await client.get("/health")).status_code == 200
    ok = await client.post(CHAT, json=chat_body())
    assert ok.status_code == 200


def test_table_is_large_and_distinct():
    """The table has at least 30 distinct cases."""
    assert len(CASES) >= 30 and len({case[0] for case in CASES}) == len(CASES)


async def test_messages_name_the_field(client):
    """Messages are specific: the unknown argument, the part type and the unsupported field are named."""
    r = await client.post(CHAT, json=chat(frobnicate=1))
    assert r.json()["error"]["message"] == "Unrecognized request argument supplied: frobnicate"
    r = await client.post(CHAT, json={"model": "fake-model", "messages": [
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]})
    assert "input_audio" in r.json()["error"]["message"]
    r = await client.post(CHAT, json=chat(n=3))
    assert r.json()["error"]["message"].startswith("'n' is not supported")
    r = await client.post(CHAT, json={**chat(), "model": "gpt-4o"})
    assert "gpt-4o" in r.json()["error"]["message"] and "fake-model" in r.json()["error"]["message"]


async def test_oversized_chunked_body(client):
    """A chunked body (no Content-Length) over the limit is refused with 413 while reading."""

    async def chunks():
        for _ in range(100):
            yield b"x" * 1024

    r = await client.post(CHAT, content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


async def test_no_content_type_needed(client):
    """A JSON body without a JSON content type (curl -d) is still accepted."""
    r = await client.post(CHAT, content=json.dumps(chat_body()).encode(),
                          headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200


async def test_405_lists_allowed_methods(client):
    """405 keeps the Allow header."""
    r = await client.get(CHAT)
    assert r.status_code == 405 and "POST" in r.headers["allow"]
