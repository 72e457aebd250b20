"""The Anthropic Messages API on the real default model, driven by the official `anthropic` SDK:
a message, a stream the SDK accumulates into the same message, a tool-use round trip, count_tokens,
a typed error, structured output, and greedy text equal to the chat completion of the same
conversation."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

from tests.real_server import ServeProcess

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}  # this SDK version has no temperature argument any more: sent as is
TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
    "additionalProperties": False}}]


@pytest.fixture
def client(default_server: ServeProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=default_server.base_url, api_key="unused", max_retries=0, timeout=120)


def _blocks(message) -> list[dict]:
    return [{k: v for k, v in block.model_dump().items() if k != "parsed_output"} for block in message.content]


def test_message_and_stream_agree(client):
    """A plain message; the SDK's stream accumulator reaches the same message."""
    reply = client.messages.create(model="default", max_tokens=24, messages=QUESTION, extra_body=GREEDY)
    assert reply.type == "message" and reply.role == "assistant" and reply.stop_reason in ("end_turn", "max_tokens")
    assert reply.content[0].type == "text" and reply.content[0].text and reply.usage.output_tokens > 0
    with client.messages.stream(model="default", max_tokens=24, messages=QUESTION, extra_body=GREEDY) as stream:
        deltas = [e.delta.text for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert _blocks(final) == _blocks(reply) and "".join(deltas) == reply.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (reply.stop_reason, reply.usage.output_tokens)


def test_greedy_text_equals_the_chat_completion(client, default_server):
    """Same conversation, same settings: the Messages API and Chat Completions emit the same text."""
    system = "You are a concise assistant."
    reply = client.messages.create(model="default", max_tokens=32, system=system, messages=QUESTION,
                                   stop_sequences=["\n\n"], extra_body=GREEDY)
    chat = openai.OpenAI(base_url=f"{default_server.base_url}/v1", api_key="unused", max_retries=0)
    completion = chat.chat.completions.create(model="default", max_tokens=32, temperature=0, stop=["\n\n"],
                                              messages=[{"role": "system", "content": system}, *QUESTION])
    assert reply.content[0].text == completion.choices[0].message.content


def test_tool_use_round_trip(client):
    """tool_choice forces the tool: a tool_use block with valid input (streamed the same); its
    tool_result goes back and the model answers in text."""
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    call = client.messages.create(model="default", max_tokens=60, tools=TOOLS, messages=ask,
                                  tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
    assert call.stop_reason == "tool_use" and [b.type for b in call.content] == ["tool_use"]
    use = call.content[0]
    jsonschema.validate(use.input, TOOLS[0]["input_schema"])
    with client.messages.stream(model="default", max_tokens=60, tools=TOOLS, messages=ask,
                                tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    assert [(b.name, b.input) for b in streamed.content] == [(use.name, use.input)]
    answer = client.messages.create(model="default", max_tokens=24, tools=TOOLS, extra_body=GREEDY, messages=[
        *ask, {"role": "assistant", "content": call.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}]}])
    assert answer.content and answer.content[0].type == "text" and answer.content[0].text


def test_structured_output_through_output_config(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"], "additionalProperties": False}
    reply = client.messages.create(model="default", max_tokens=40, messages=QUESTION, extra_body=GREEDY,
                                   output_config={"format": {"type": "json_schema", "schema": schema}})
    jsonschema.validate(json.loads(reply.content[0].text), schema)


def test_count_tokens_and_a_typed_error(client):
    count = client.messages.count_tokens(model="default", messages=QUESTION, tools=TOOLS)
    assert count.input_tokens > client.messages.count_tokens(model="default", messages=QUESTION).input_tokens > 0
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="default", max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": "AAAA"}}]}])
    assert info.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-opus-4-1", max_tokens=8, messages=QUESTION)
