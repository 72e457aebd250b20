"""The Responses API on the real default model, driven by the official `openai` SDK: a response, a
stream the SDK accumulates into the same response, a reply cut by max_output_tokens, a function-call
round trip, structured output through `text.format`, a typed refusal, and greedy text equal to the
chat completion of the same conversation."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.real_server import ServeProcess

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture
def client(default_server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{default_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _items(response) -> list[dict]:
    """Output items without what differs between two requests (fresh ids) or what the SDK's parsed form adds."""
    return [{k: v for k, v in item.model_dump(exclude_none=True).items() if k not in ("id", "call_id", "parsed")}
            for item in response.output]


def test_response_and_stream_agree(client):
    """A plain response; the SDK's stream accumulator reaches the same response."""
    reply = client.responses.create(model="default", input=QUESTION, temperature=0, max_output_tokens=40)
    assert reply.status == "completed" and reply.incomplete_details is None and reply.error is None
    assert [item.type for item in reply.output] == ["message"] and reply.output_text
    assert reply.usage.output_tokens > 0 and reply.usage.total_tokens == reply.usage.input_tokens + \
        reply.usage.output_tokens
    assert reply.model_extra["dspark_stats"]["generated_tokens"] == reply.usage.output_tokens
    with client.responses.stream(model="default", input=QUESTION, temperature=0, max_output_tokens=40) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert _items(final) == _items(reply) and final.output_text == reply.output_text == "".join(deltas)
    assert (final.status, final.usage.output_tokens) == (reply.status, reply.usage.output_tokens)


def test_cut_by_max_output_tokens(client):
    """A reply cut by the limit is incomplete, streamed the same (ending in `response.incomplete`)."""
    reply = client.responses.create(model="default", input="Tell me a story.", temperature=0, max_output_tokens=5)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.output[-1].status == "incomplete" and reply.usage.output_tokens == 5
    events = list(client.responses.create(model="default", input="Tell me a story.", temperature=0,
                                          max_output_tokens=5, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.incomplete" and _items(events[-1].response) == _items(reply)


def test_function_call_round_trip(client):
    """A forced named function gives a function_call item with valid JSON arguments (streamed the same);
    sent back with its output, the model answers with a message."""
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    forced = {"type": "function", "name": "get_weather"}
    reply = client.responses.create(model="default", input=ask, tools=[WEATHER], tool_choice=forced, temperature=0,
                                    max_output_tokens=60)
    assert reply.status == "completed" and [item.type for item in reply.output] == ["function_call"]
    call = reply.output[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    with client.responses.stream(model="default", input=ask, tools=[WEATHER], tool_choice=forced, temperature=0,
                                 max_output_tokens=60) as stream:
        streamed = stream.get_final_response()
    assert [(item.name, item.arguments) for item in streamed.output] == [(call.name, call.arguments)]
    answer = client.responses.create(model="default", tools=[WEATHER], temperature=0, max_output_tokens=24, input=[
        *ask, call, {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}])
    assert [item.type for item in answer.output] == ["message"] and answer.output_text


def test_json_schema_text_format(client):
    """text.format json_schema goes through the structured-output path: the text parses and validates."""
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
        "required": ["name", "hobbies"], "additionalProperties": False}
    fmt = {"type": "json_schema", "name": "person", "schema": schema, "strict": True}
    reply = client.responses.create(model="default", input="Describe Ann, who likes chess.", text={"format": fmt},
                                    temperature=0, max_output_tokens=60)
    assert reply.status == "completed" and reply.text.format.type == "json_schema"
    jsonschema.validate(json.loads(reply.output_text), schema)
    assert reply.model_extra["dspark_stats"]["grammar_masks"] >= reply.usage.output_tokens


def test_greedy_text_equals_the_chat_completion(client):
    """Same conversation (instructions, an earlier exchange), same limit: the same text as Chat Completions."""
    system = "You are a concise assistant."
    history = [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"}]
    reply = client.responses.create(model="default", instructions=system, temperature=0, max_output_tokens=32, input=[
        history[0], {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": history[1]["content"], "annotations": []}]},
        {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}])
    completion = client.chat.completions.create(model="default", temperature=0, max_tokens=32, messages=[
        {"role": "system", "content": system}, *history, {"role": "user", "content": QUESTION}])
    assert reply.output_text == completion.choices[0].message.content
    assert reply.usage.input_tokens == completion.usage.prompt_tokens
    assert reply.usage.output_tokens == completion.usage.completion_tokens


def test_typed_refusal(client):
    """The server is stateless: previous_response_id is refused by name, as the SDK's BadRequestError."""
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="default", input=QUESTION, previous_response_id="resp_123")
    assert info.value.body["param"] == "previous_response_id" and "stateless" in info.value.body["message"]
