"""Structured output through `dspark serve` on the default model, driven by the OpenAI SDK.

`response_format` (json_object, json_schema from a pydantic model), forced tool calls (named and
"required"), streamed and not, in the SDK's parsed form; the completions endpoint; and clear 400s
for schemas the grammar engine cannot enforce. Exactness and the schema corpus are engine tests
(tests/engine/test_lossless_grammar.py, test_smollm2_structured.py).
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.real_server import ServeProcess

pytestmark = pytest.mark.slow

WEATHER = "What's the weather in Paris?"


class GetWeather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=20)
    unit: str = Field(pattern="^(c|f)$")


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int
    hobbies: list[str] = Field(max_length=3)


@pytest.fixture
def client(default_server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{default_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _ask(client, content, **extra):
    return client.chat.completions.create(model="default", messages=[{"role": "user", "content": content}],
                                          temperature=0, max_tokens=80, **extra)


def test_json_schema_from_a_pydantic_model(client):
    """`parse(response_format=Model)`: strict json_schema, a parsed instance, streamed and not."""
    messages = [{"role": "user", "content": "Describe a person called Ann, 31, who likes chess."}]
    reply = client.chat.completions.parse(model="default", messages=messages, response_format=Person,
                                          temperature=0, max_tokens=80)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Person)
    assert reply.dspark_stats["grammar_masks"] >= reply.usage.completion_tokens  # type: ignore[attr-defined]
    with client.chat.completions.stream(model="default", messages=messages, response_format=Person,
                                        temperature=0, max_tokens=80) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == choice.message.parsed


def test_json_object(client):
    """json_object: the answer is a JSON object."""
    reply = _ask(client, "Reply with a JSON object with the key 'ok' set to true.",
                 response_format={"type": "json_object"})
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "GetWeather"}}, "required"])
def test_forced_tool_call_parsed(client, choice):
    """A named function, and "required" with parallel_tool_calls false: exactly one valid call, in
    the SDK's parsed form, streamed and not."""
    tools = [openai.pydantic_function_tool(GetWeather)]
    extra = {"parallel_tool_calls": False} if choice == "required" else {}
    messages = [{"role": "user", "content": WEATHER}]
    reply = client.chat.completions.parse(model="default", messages=messages, tools=tools, tool_choice=choice,
                                          temperature=0, max_tokens=80, **extra)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls" and len(message.tool_calls) == 1
    assert isinstance(message.tool_calls[0].function.parsed_arguments, GetWeather)
    with client.chat.completions.stream(model="default", messages=messages, tools=tools, tool_choice=choice,
                                        temperature=0, max_tokens=80, **extra) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.parsed_arguments == \
        message.tool_calls[0].function.parsed_arguments


def test_required_allows_several_calls(client):
    """"required" without parallel_tool_calls false: one or more calls, each valid (a small model may
    keep calling until max_tokens, which is then reported as `length`)."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}}}]
    reply = _ask(client, WEATHER, tools=tools, tool_choice="required")
    calls = reply.choices[0].message.tool_calls
    assert calls and reply.choices[0].finish_reason in ("tool_calls", "length")
    for call in calls:
        assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"city"}


def test_completions_response_format(client):
    """The completions endpoint takes response_format too."""
    schema = {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 3, "maxItems": 3}
    reply = client.completions.create(model="default", prompt="A JSON list of three colours:", temperature=0,
                                      max_tokens=40, extra_body={"response_format": {
                                          "type": "json_schema", "json_schema": {"name": "c", "schema": schema}}})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].text), schema)


@pytest.mark.parametrize("field,body,named", [
    ("response_format", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "array", "uniqueItems": True}}}}, "uniqueItems"),
    ("tool_choice", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}}}], "tool_choice": "required"},
     "if"),
])
def test_unenforceable_schema_is_refused_by_name(client, field, body, named):
    """A schema keyword the grammar engine cannot enforce: 400 naming it, never served unconstrained."""
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, "hi", **body)
    error = info.value.body
    assert info.value.status_code == 400 and error["param"] == field and named in error["message"]
