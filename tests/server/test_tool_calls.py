"""Tool calls and reasoning through the HTTP layer, read by the real OpenAI SDK over loopback.

The engine is scripted (`FakeEngine`): it emits a model's tool-call text split into rounds at awkward
places, as speculative rounds do. (The default SmolLM2-135M does not call tools: it never emitted a
`<tool_call>` block in our probes, so the model layer is scripted here; parsing is exhaustively
tested over every chunking in tests/server/test_outputs.py.)
"""

from __future__ import annotations

import json
from dataclasses import replace

import openai
import pytest

from engine.api import GenerationRequest
from tests.server.conftest import live_server
from tests.server.fake_engine import INFO, FakeEngine, Script

HERMES_TEMPLATE = "{% if tools %}<tools>{{ tools }}</tools>{% endif %}... <tool_call> ... {{ message.tool_calls }}"
QWEN3_TEMPLATE = HERMES_TEMPLATE + " <think> </think>"
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
CALL_TEXT = 'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "setup.py"}}\n</tool_call>'
TWO_CALLS = CALL_TEXT + '\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>'
ANSWER = "setup.py declares the package demo."


def _rounds(text: str, sizes: tuple[int, ...] = (3, 7, 1, 11, 5)) -> list[str]:
    """`text` cut into rounds of varying length (tags and JSON split mid-way)."""
    out, i, k = [], 0, 0
    while i < len(text):
        out.append(text[i: i + sizes[k % len(sizes)]])
        i, k = i + sizes[k % len(sizes)], k + 1
    return out


def agent_script(request: GenerationRequest) -> Script:
    """Call read_file until the prompt carries a tool result, then answer."""
    prompt = bytes(request.prompt_ids).decode(errors="replace")
    return Script(rounds=_rounds(ANSWER if "from setuptools" in prompt else CALL_TEXT))


def _engine(script=agent_script, template: str = HERMES_TEMPLATE) -> FakeEngine:
    return FakeEngine(script, template=template, info=replace(INFO, context_length=8192))


def _sdk(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=30)


def _accumulate(stream) -> dict:
    """The message a client builds from the deltas (the way the SDK's docs accumulate tool calls)."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            for call in delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.id or slot["id"]
                slot["name"] += (call.function.name or "") if call.function else ""
                slot["arguments"] += (call.function.arguments or "") if call.function else ""
            finish = choice.finish_reason or finish
    return {"content": content or None, "reasoning": reasoning or None, "finish": finish,
            "calls": [calls[i] for i in sorted(calls)]}


def _message(reply) -> dict:
    message = reply.choices[0].message
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
             for c in message.tool_calls or []]
    return {"content": message.content, "reasoning": (message.model_extra or {}).get("reasoning_content"),
            "finish": reply.choices[0].finish_reason, "calls": calls}


def _without_ids(message: dict) -> dict:
    return {**message, "calls": [{k: v for k, v in c.items() if k != "id"} for c in message["calls"]]}


def test_sdk_parses_tool_calls_streamed_and_not():
    """The SDK reads our tool calls; the streamed, accumulated message equals the non-streamed one."""
    with live_server(_engine()) as live:
        client = _sdk(live.base_url)
        args = {"model": "fake-model", "messages": [{"role": "user", "content": "read setup.py"}], "tools": TOOLS}
        whole = _message(client.chat.completions.create(**args))
        streamed = _accumulate(client.chat.completions.create(**args, stream=True))
    assert whole["finish"] == "tool_calls" and whole["content"] == "Let me look.\n"
    assert [(c["name"], json.loads(c["arguments"])) for c in whole["calls"]] == [("read_file", {"path": "setup.py"})]
    assert whole["calls"][0]["id"].startswith("call_") and streamed["calls"][0]["id"].startswith("call_")
    assert _without_ids(streamed) == _without_ids(whole)


def test_read_file_loop_completes():
    """read_file -> tool result -> answer, driven by the SDK as an agent would."""
    files = {"setup.py": "from setuptools import setup\nsetup(name='demo')"}
    with live_server(_engine()) as live:
        client = _sdk(live.base_url)
        messages: list = [{"role": "user", "content": "What does setup.py declare?"}]
        for _ in range(3):
            reply = client.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if reply.choices[0].finish_reason != "tool_calls":
                break
            for call in message.tool_calls:
                path = json.loads(call.function.arguments)["path"]
                messages.append({"role": "tool", "tool_call_id": call.id, "content": files[path]})
    assert messages[-1]["content"] == ANSWER and len(messages) == 4
    assert messages[1]["tool_calls"][0]["function"]["name"] == "read_file"


def test_parallel_tool_calls_false_keeps_the_first():
    """Two calls in the output; `parallel_tool_calls: false` returns only the first."""
    engine = _engine(lambda request: Script(rounds=_rounds(TWO_CALLS)))
    with live_server(engine) as live:
        client = _sdk(live.base_url)
        args = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS}
        both = _message(client.chat.completions.create(**args))
        first = _message(client.chat.completions.create(**args, parallel_tool_calls=False))
        first_streamed = _accumulate(client.chat.completions.create(**args, parallel_tool_calls=False, stream=True))
    assert [json.loads(c["arguments"])["path"] for c in both["calls"]] == ["setup.py", "a.txt"]
    assert [json.loads(c["arguments"])["path"] for c in first["calls"]] == ["setup.py"]
    assert _without_ids(first_streamed) == _without_ids(first)


def test_without_tools_the_text_is_content():
    """A request without tools gets the raw text, tags included: nothing is parsed or lost."""
    engine = _engine(lambda request: Script(rounds=_rounds(CALL_TEXT)))
    with live_server(engine) as live:
        reply = _sdk(live.base_url).chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "x"}])
    assert reply.choices[0].message.content == CALL_TEXT and reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_is_split_for_a_thinking_template(stream):
    """`<think>...</think>` goes to reasoning_content, the rest to content; usage counts reasoning tokens."""
    text = "<think>\nThe user wants a file.\n</think>\n\n" + CALL_TEXT
    engine = _engine(lambda request: Script(rounds=_rounds(text)), template=QWEN3_TEMPLATE)
    with live_server(engine) as live:
        client = _sdk(live.base_url)
        args = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS}
        if stream:
            got = _accumulate(client.chat.completions.create(**args, stream=True))
        else:
            reply = client.chat.completions.create(**args)
            got = _message(reply)
            assert reply.usage.completion_tokens_details.reasoning_tokens > 0
    assert got["reasoning"] == "The user wants a file." and got["content"] == "Let me look.\n"
    assert got["finish"] == "tool_calls" and got["calls"][0]["name"] == "read_file"


def test_history_tool_calls_reach_a_tool_template():
    """With a template that renders tools, tools and history calls go to it as OpenAI-shaped objects."""
    engine = _engine()
    with live_server(engine) as live:
        _sdk(live.base_url).chat.completions.create(model="fake-model", tools=TOOLS, messages=[
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "read_file", "arguments": "{\"path\": \"x\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "data"}])
    messages, kwargs = engine.encoded[-1]
    assert kwargs["tools"] == TOOLS
    assert messages[1]["tool_calls"] == [{"id": "c1", "type": "function",
                                          "function": {"name": "read_file", "arguments": {"path": "x"}}}]
    assert messages[2] == {"role": "tool", "content": "data", "tool_call_id": "c1"}
