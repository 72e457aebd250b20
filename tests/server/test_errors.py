"""The error table: every malformed or unsupported request gets the right OpenAI-shaped error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.server.conftest import CHAT, COMPLETIONS, chat_body

pytestmark = pytest.mark.anyio

MSG = [{"role": "user", "content": "hi"}]
BAD = "invalid_request_error"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


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
    ("max-tokens-fraction", "POST", CHAT, chat(max_tokens=5.5), 400, BAD, "max_tokens", "invalid_type"),
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
    ("too-many-stops", "POST", CHAT, chat(stop=[f"s{i}" for i in range(65)]), 400, BAD, "stop", "invalid_value"),
    ("stop-int", "POST", CHAT, chat(stop=7), 400, BAD, "stop", "invalid_type"),
    ("stop-empty-string", "POST", CHAT, chat(stop=["ok", ""]), 400, BAD, "stop[1]", "invalid_value"),
    ("stop-list-of-int", "POST", CHAT, chat(stop=[1]), 400, BAD, "stop[0]", "invalid_type"),
    ("n-two", "POST", CHAT, chat(n=2), 400, BAD, "n", "unsupported_parameter"),
    ("n-string", "POST", CHAT, chat(n="1"), 400, BAD, "n", "invalid_type"),
    ("tool-not-function", "POST", CHAT, chat(tools=[{"type": "web_search", "function": {"name": "f"}}]), 400, BAD,
     "tools[0].type", "invalid_value"),
    ("tool-without-name", "POST", CHAT, chat(tools=[{"type": "function", "function": {}}]), 400, BAD,
     "tools[0].function.name", "missing_required_parameter"),
    ("tool-choice-required-no-tools", "POST", CHAT, chat(tool_choice="required"), 400, BAD, "tool_choice",
     "invalid_value"),
    ("tool-choice-named-unknown", "POST", CHAT, chat(tools=TOOLS, tool_choice={"type": "function", "function": {
        "name": "f"}}), 400, BAD, "tool_choice", "invalid_value"),
    ("tool-choice-named-no-name", "POST", CHAT, chat(tools=TOOLS, tool_choice={"type": "function"}), 400, BAD,
     "tool_choice", "invalid_value"),
    ("function-call-required", "POST", CHAT, chat(functions=[TOOLS[0]["function"]], function_call="required"), 400,
     BAD, "function_call", "invalid_value"),
    ("tool-choice-bad", "POST", CHAT, chat(tool_choice="sometimes"), 400, BAD, "tool_choice", "invalid_value"),
    ("response-format-type", "POST", CHAT, chat(response_format={"type": "xml"}), 400, BAD, "response_format",
     "invalid_value"),
    ("response-format-schema-not-object", "POST", CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": 5}}), 400, BAD, "response_format", "invalid_value"),
    ("response-format-unenforceable", "POST", CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "array", "uniqueItems": True}}}), 400, BAD, "response_format",
     "invalid_request"),
    ("response-format-bad-regex", "POST", COMPLETIONS, {"model": "fake-model", "prompt": "x", "response_format": {
        "type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "(?<=a)b"}}}}, 400, BAD,
     "response_format", "invalid_request"),
    ("audio-output", "POST", CHAT, chat(modalities=["text", "audio"]), 400, BAD, "modalities",
     "unsupported_parameter"),
    ("top-logprobs-range", "POST", CHAT, chat(logprobs=True, top_logprobs=21), 400, BAD, "top_logprobs",
     "invalid_value"),
    ("logit-bias-key", "POST", CHAT, chat(logit_bias={"the": 5}), 400, BAD, "logit_bias", "invalid_value"),
    ("repetition-penalty-zero", "POST", CHAT, chat(repetition_penalty=0), 400, BAD, "repetition_penalty",
     "invalid_value"),
    ("frequency-penalty-range", "POST", CHAT, chat(frequency_penalty=3), 400, BAD, "frequency_penalty",
     "invalid_value"),
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
    ("content-number", "POST", CHAT, {"model": "fake-model", "messages": [{"role": "user", "content": 5}]}, 400,
     BAD, "messages[0].content", "invalid_type"),
    ("user-without-content", "POST", CHAT, {"model": "fake-model", "messages": [{"role": "user"}]}, 400,
     BAD, "messages[0].content", "missing_required_parameter"),
    ("assistant-tool-call-without-function", "POST", CHAT, {"model": "fake-model", "messages": [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}]}, 400, BAD,
     "messages[0].tool_calls[0].function", "missing_required_parameter"),
    ("template-kwargs-type", "POST", CHAT, chat(chat_template_kwargs="x"), 400, BAD, "chat_template_kwargs",
     "invalid_type"),
    ("dspark-bad-sampler", "POST", CHAT, chat(dspark={"sampler": "greedy"}), 400, BAD, "dspark.sampler",
     "invalid_value"),
    ("unknown-model", "POST", CHAT, {**chat(), "model": "gpt-4o"}, 404, BAD, "model", "model_not_found"),
    ("context-max-tokens", "POST", CHAT, chat(max_tokens=10_000), 400, BAD, "max_tokens",
     "context_length_exceeded"),
    # The prompt alone exceeds the window: refused where it is rendered, blaming the messages.
    ("context-long-prompt", "POST", CHAT, chat_body("x" * 400), 400, BAD, "messages", "context_length_exceeded"),
    ("context-prompt-plus-max-tokens", "POST", CHAT, chat_body("x" * 100, max_tokens=200), 400, BAD, "max_tokens",
     "context_length_exceeded"),
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
    ("completions-logprobs-range", "POST", COMPLETIONS, {"model": "fake-model", "prompt": "a", "logprobs": 30}, 400,
     BAD, "logprobs", "invalid_value"),
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
    """Messages are specific: the part type, the unsupported field and the unknown model are named."""
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


async def test_json_content_type_required(client):
    """A JSON body without a JSON content type (curl -d's form type) is refused with 415 (see test_exposure)."""
    r = await client.post(CHAT, content=json.dumps(chat_body()).encode(),
                          headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"


async def test_405_lists_allowed_methods(client):
    """405 keeps the Allow header."""
    r = await client.get(CHAT)
    assert r.status_code == 405 and "POST" in r.headers["allow"]
