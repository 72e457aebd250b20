"""The request policy over the HTTP layer: tolerant by default (ignore, report, count), strict on demand."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from server.app import create_app
from server.policy import HEADER, field_names, unmodelled
from server.protocol import ChatCompletionRequest
from tests.server.conftest import CHAT, COMPLETIONS, chat_body, settings
from tests.server.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio

# Bodies the strict policy refused and the tolerant one serves.
TOLERATED: list[tuple[str, dict[str, Any]]] = [
    ("inert-fields", chat_body(store=True, metadata={"a": "b"}, prompt_cache_key="k", safety_identifier="s",
                               service_tier="auto", verbosity="low", user="u")),
    ("unknown-field", chat_body(frobnicate=1)),
    ("message-unknown-key", {"messages": [{"role": "user", "content": "x", "mood": "happy"}]}),
    ("no-model", {"messages": [{"role": "user", "content": "x"}]}),
    ("integral-floats", chat_body(max_tokens=16.0, seed=3.0, top_k=40.0)),
    ("nine-stops", chat_body(stop=[f"<s{i}>" for i in range(9)])),
    ("null-assistant-content", {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": None},
                                             {"role": "user", "content": "b"}]}),
    ("empty-assistant-content", {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""},
                                              {"role": "user", "content": "b"}]}),
    ("reasoning-in-history", {"messages": [{"role": "user", "content": "a"},
                                           {"role": "assistant", "content": "b", "reasoning_content": "hmm"},
                                           {"role": "user", "content": "c"}]}),
    ("penalties", chat_body(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.1,
                            logit_bias={"42": 5, "7": -100})),
    ("logprobs", chat_body(logprobs=True, top_logprobs=3)),
    ("reasoning-effort", chat_body(reasoning_effort="none")),
    ("stream-options-unknown", chat_body(stream=True, stream_options={"include_usage": True, "x": 1})),
    ("dspark-unknown", chat_body(dspark={"turbo": True})),
]


@pytest.mark.parametrize("body", [b for _, b in TOLERATED], ids=[i for i, _ in TOLERATED])
async def test_tolerated_bodies_are_served(client, body):
    """Each body the old policy refused gets 200."""
    r = await client.post(CHAT, json=body)
    assert r.status_code == 200, r.text


async def test_ignored_fields_are_reported_and_counted(client):
    """The header lists each ignored name once (indices dropped); /metrics counts them by name."""
    body = {"messages": [{"role": "user", "content": "x", "cache_control": {}},
                         {"role": "assistant", "content": "y", "cache_control": {}},
                         {"role": "user", "content": "z"}], "metadata": {"a": 1}, "store": True}
    r = await client.post(CHAT, json=body)
    assert r.status_code == 200
    assert r.headers[HEADER] == "messages[].cache_control, metadata, store"
    metrics = (await client.get("/metrics")).text
    assert 'dspark_ignored_fields_total{field="metadata"} 1.0' in metrics
    assert 'dspark_ignored_fields_total{field="messages[].cache_control"} 1.0' in metrics
    r = await client.post(CHAT, json=chat_body(stream=True, metadata={}))
    assert r.headers[HEADER] == "metadata"
    assert HEADER not in (await client.post(CHAT, json=chat_body())).headers


async def test_engine_gets_the_processors_and_limits(client, engine):
    """Penalties, bias, integral floats and the served model reach the engine request."""
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 16.0, "presence_penalty": 0.5,
            "frequency_penalty": -0.25, "repetition_penalty": 1.2, "logit_bias": {"7": 100, "3": -1}}
    assert (await client.post(CHAT, json=body)).status_code == 200
    req = engine.submitted[-1]
    assert req.max_tokens == 16
    s = req.sampling
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.5, -0.25, 1.2)
    assert s.logit_bias == ((3, -1.0), (7, 100.0))


@pytest.mark.parametrize("bias", [{"7": 150}, {"7": -100.5}, {"²": 1}, {"007": 1}, {"1" * 5000: 1}, {"-1": 1}])
async def test_logit_bias_outside_the_contract_is_400(client, bias):
    """Bias values outside [-100, 100] and keys that are not canonical token ids are refused, naming the field."""
    r = await client.post(CHAT, json=chat_body(logit_bias=bias))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("logit_bias")


async def test_reasoning_effort_none_turns_thinking_off(client, engine):
    """`reasoning_effort: "none"` reaches the template as enable_thinking=False; other values as themselves."""
    await client.post(CHAT, json=chat_body(reasoning_effort="none"))
    assert engine.encoded[-1][1] == {"enable_thinking": False}
    await client.post(CHAT, json=chat_body(reasoning_effort="high", chat_template_kwargs={"enable_thinking": True}))
    assert engine.encoded[-1][1] == {"enable_thinking": True, "reasoning_effort": "high"}


def test_unmodelled_paths():
    """Unknown keys are found at the top level, in messages, tool calls and nested objects."""
    data = {"a": 1, "messages": [{"role": "user", "content": "x", "b": 2},
                                 {"role": "assistant", "tool_calls": [{"function": {"name": "f", "c": 3}, "d": 4}]}],
            "stream_options": {"e": 5}, "tools": [{"type": "function", "function": {"name": "g", "f": 6}}]}
    paths = unmodelled(ChatCompletionRequest, data)
    assert paths == ["a", "messages[0].b", "messages[1].tool_calls[0].function.c", "messages[1].tool_calls[0].d",
                     "stream_options.e", "tools[0].function.f"]
    assert field_names(paths)[1] == "messages[].b"


STRICT_CASES: list[tuple[str, dict[str, Any], int, str | None, str | None]] = [
    ("unknown", chat_body(frobnicate=1), 400, "frobnicate", "unrecognized_argument"),
    ("message-unknown", {"model": "fake-model", "messages": [{"role": "user", "content": "x", "mood": 1}]}, 400,
     "messages[0].mood", "unrecognized_argument"),
    ("store-true", chat_body(store=True), 400, "store", "unsupported_parameter"),
    ("float-fraction", chat_body(max_tokens=5.5), 400, "max_tokens", "invalid_type"),
    ("float-int-is-the-integer", chat_body(max_tokens=5.0), 200, None, None),  # as JSON Schema's `integer`
    ("five-stops", chat_body(stop=["a", "b", "c", "d", "e"]), 400, "stop", "invalid_value"),
    ("user-accepted", chat_body(user="u", store=False, metadata={"k": "v"}), 200, None, None),
    ("four-stops", chat_body(stop=["a", "b", "c", "d"]), 200, None, None),
]


@pytest.mark.parametrize(("body", "status", "param", "code"), [c[1:] for c in STRICT_CASES],
                         ids=[c[0] for c in STRICT_CASES])
async def test_strict_params(body, status, param, code):
    """--strict-params refuses what the tolerant policy ignores, as OpenAI does."""
    app = create_app(settings(strict_params=True), FakeEngine())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        r = await c.post(CHAT, json=body)
    assert r.status_code == status, r.text
    if status != 200:
        assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (param, code)


async def test_completions_tolerate_too(client):
    """Text completions: many stops, unknown fields and no model are served."""
    r = await client.post(COMPLETIONS, json={"prompt": "a", "stop": [str(i) for i in range(9)], "x": 1})
    assert r.status_code == 200 and r.headers[HEADER] == "x"
