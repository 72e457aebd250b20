"""The Responses API (`POST /v1/responses`) over the fake engine: request conversion to the chat
request, refusals naming the Responses field, ignored fields, the response object and the event
sequence (each event checked against the documented schema and the `openai` SDK's types), the SDK's
stream accumulator, and an error after the stream started. (The real model: test_responses_real.py.)"""

from __future__ import annotations

import json
import typing
from dataclasses import replace

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError

from server.app import create_app
from server.errors import APIError
from server.responses.convert import chat_request, renamed
from server.responses.protocol import ResponsesRequest, event_schema, request_schema, response_schema
from tests.server.conftest import settings, sse_frames
from tests.server.fake_engine import INFO, FakeEngine, Script

pytestmark = pytest.mark.anyio

RESPONSES = "/v1/responses"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL_TEXT = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THINKING_TEMPLATE = "{{ messages }} <think> </think>"  # the fake renders its own prompt; this marks thinking


def convert(**body):
    return chat_request(ResponsesRequest.model_validate({"model": "fake-model", **body}))


def _messages(chat) -> list[dict]:
    out = []
    for m in chat.messages:
        item = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            item["calls"] = [(c.id, c.function.name, c.function.arguments) for c in m.tool_calls]
        if m.tool_call_id:
            item["tool_call_id"] = m.tool_call_id
        out.append(item)
    return out


# ---- conversion ---------------------------------------------------------------------------------------


def test_conversion_of_a_function_call_round_trip():
    """instructions first; text parts; an assistant message and the function_call items after it make one
    turn; outputs become tool messages answering their call_id; reasoning items are not replayed."""
    chat = convert(instructions="Be brief.", tools=[WEATHER], parallel_tool_calls=False, input=[
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in"},
                                                         {"type": "input_text", "text": "Paris and Oslo?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}', "status": "completed"},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "12 C"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "3 C"}]},
    ])
    assert _messages(chat) == [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather in\nParis and Oslo?"},
        {"role": "assistant", "content": "Checking.", "calls": [("call_1", "get_weather", '{"city": "Paris"}'),
                                                                ("call_2", "get_weather", '{"city": "Oslo"}')]},
        {"role": "tool", "content": "12 C", "tool_call_id": "call_1"},
        {"role": "tool", "content": "3 C", "tool_call_id": "call_2"},
    ]
    assert chat.tool_defs[0].function.parameters == WEATHER["parameters"] and chat.parallel_tool_calls is False


def test_conversion_of_settings():
    """A string input is one user message; sampling, limits, a named tool_choice, reasoning effort and
    text.format map to their chat fields."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = convert(input="Hi", max_output_tokens=32, temperature=0, top_p=0.5, tools=[WEATHER],
                   tool_choice={"type": "function", "name": "get_weather"}, reasoning={"effort": "none"},
                   text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}})
    assert _messages(chat) == [{"role": "user", "content": "Hi"}]
    assert (chat.max_tokens, chat.temperature, chat.top_p) == (32, 0, 0.5)
    assert chat.forced_tool_choice == "get_weather" and chat.reasoning_effort == "none"
    assert chat.response_format == {"type": "json_schema", "json_schema": {"name": "out", "schema": schema,
                                                                           "strict": True}}
    assert convert(input="x", text={"format": {"type": "json_object"}}).response_format == {"type": "json_object"}
    assert convert(input="x", tools=[WEATHER], tool_choice="none").tool_defs == []


def test_chat_errors_name_the_responses_field():
    """A chat-side refusal names the field the client sent."""
    with pytest.raises(APIError) as caught:
        convert(input="x", tools=[WEATHER], tool_choice={"type": "function", "name": "other"})
    assert caught.value.param == "tool_choice" and "'other'" in caught.value.message
    error = renamed(APIError(400, "Invalid value for 'messages[1].content'.", param="messages[1].content"),
                    ["instructions", "input[3]"])
    assert (error.param, error.message) == ("input[3]", "Invalid value for 'input[3]'.")
    assert renamed(APIError(400, "too long", param="max_tokens")).param == "max_output_tokens"
    assert renamed(APIError(400, "bad", param="response_format")).param == "text.format"
    assert renamed(APIError(400, "bad", param="tools[1].function.parameters")).param == "tools[1].parameters"


# ---- refusals ------------------------------------------------------------------------------------------


async def test_tools_of_other_types_are_ignored_and_reported():
    """Codex sends hosted tools (web_search) and namespaces of tools with its function tools: the model is
    offered the function tools, and the others are named in X-Dspark-Ignored (refused under strict)."""
    codex_like = [WEATHER, {"type": "web_search", "external_web_access": False},
                  {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "close_agent"}]}]
    roomy = FakeEngine(info=replace(INFO, context_length=1 << 16))
    for strict in (False, True):
        app = create_app(settings(strict_params=strict), roomy)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            r = await c.post(RESPONSES, json=body(tools=codex_like))
        if strict:
            assert r.status_code == 400 and r.json()["error"]["param"] == "tools[1]"
            continue
        assert r.status_code == 200, r.text
        assert r.headers["X-Dspark-Ignored"] == "tools[]"
        prompt = bytes(roomy.submitted[-1].prompt_ids).decode()
        assert "get_weather" in prompt and "close_agent" not in prompt and "web_search" not in prompt


def body(**extra):
    return {"model": "fake-model", "input": "hi", **extra}


@pytest.mark.parametrize("extra,param,code", [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
    ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "Look:"},
                                             {"type": "input_image", "image_url": "data:,"}]}]},
     "input[0].content[1]", "unsupported_parameter"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0]", "invalid_value"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "invalid_value"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input", "invalid_value"),
    ({"input": []}, "input", "invalid_value"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice", "invalid_value"),
    ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
    ({"text": {"format": {"type": "xml"}}}, "text.format", "invalid_value"),
    ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
])
async def test_refusals_name_the_field(client, extra, param, code):
    """A 400 in OpenAI's shape naming the Responses field, before anything is generated."""
    r = await client.post(RESPONSES, json=body(**extra))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error"), error
    if param == "previous_response_id":
        assert "stateless" in error["message"] and "`input`" in error["message"]


async def test_context_overflow_names_input():
    """A prompt longer than the window is refused naming `input`; a long max_output_tokens is only a bound."""
    app = create_app(settings(), FakeEngine(info=replace(INFO, context_length=64)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        long = await c.post(RESPONSES, json=body(input="x" * 200))
        bounded = await c.post(RESPONSES, json=body(max_output_tokens=10**9))
    assert long.status_code == 400 and long.json()["error"]["param"] == "input"
    assert long.json()["error"]["code"] == "context_length_exceeded"
    assert bounded.status_code == 200 and bounded.json()["status"] == "completed"


async def test_ignored_fields_are_reported(client):
    """OpenAI's inert fields and unknown ones are served, ignored and named in X-Dspark-Ignored."""
    r = await client.post(RESPONSES, json=body(metadata={"k": "v"}, store=True, truncation="auto",
                                                include=["reasoning.encrypted_content"], user="u",
                                                reasoning={"effort": "low", "summary": "auto"}, foo=1))
    assert r.status_code == 200
    names = r.headers["X-Dspark-Ignored"].split(", ")
    assert set(names) == {"metadata", "store", "truncation", "include", "user", "reasoning.summary", "foo"}
    assert r.json()["store"] is False and r.json()["metadata"] == {}


async def test_strict_params_refuse_unknown_fields():
    app = create_app(settings(strict_params=True), FakeEngine())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        unknown = await c.post(RESPONSES, json=body(foo=1))
        inert = await c.post(RESPONSES, json=body(store=False, metadata={"k": "v"}))
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "foo"
    assert inert.status_code == 200


# ---- replies and events -----------------------------------------------------------------------------


def _sdk_valid(type_, value) -> None:
    """`value` validates as the SDK type (missing `cache_write_tokens`, which this server does not report, aside)."""
    try:
        TypeAdapter(type_).validate_python(value)
    except ValidationError as exc:
        others = [e for e in exc.errors() if e["loc"][-1] != "cache_write_tokens"]
        assert not others, others


def _events(text: str) -> list[dict]:
    """The named events of a stream, checked: `event:` is the payload's type, data is one JSON object."""
    out = []
    for frame in sse_frames(text):
        if frame.startswith(":"):
            continue
        name, data = frame.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data[len("data: "):])
        assert payload["type"] == name[len("event: "):]
        out.append(payload)
    return out


# The SDK's event class for each event type (its union is discriminated by the SDK, not by pydantic).
SDK_EVENTS = {typing.get_args(cls.model_fields["type"].annotation)[0]: cls
              for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])}


def _check_events(events: list[dict]) -> None:
    """Sequence numbers count from 0; every event matches the documented schema and the SDK's types."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    schema = event_schema()
    for event in events:
        jsonschema.validate(event, schema)
        _sdk_valid(SDK_EVENTS[event["type"]], event)


def _without_ids(output: list[dict]) -> list[dict]:
    """Output items without what differs between two requests (fresh ids) or what the SDK adds when parsing."""
    return [{k: v for k, v in item.items() if k not in ("id", "call_id", "parsed_arguments")} for item in output]


async def test_reply_and_stream(client):
    """The reply's shape (documented schema, SDK type) and the stream's event sequence accumulating to it."""
    reply = await client.post(RESPONSES, json=body(instructions="Be brief.", temperature=0.5, max_output_tokens=16))
    obj = reply.json()
    jsonschema.validate(obj, response_schema())
    _sdk_valid(Response, obj)
    assert obj["id"].startswith("resp_") and obj["object"] == "response" and obj["status"] == "completed"
    assert (obj["instructions"], obj["temperature"], obj["max_output_tokens"]) == ("Be brief.", 0.5, 16)
    assert obj["incomplete_details"] is None and obj["error"] is None and obj["previous_response_id"] is None
    [message] = obj["output"]
    assert message["type"] == "message" and message["id"].startswith("msg_") and message["status"] == "completed"
    assert message["content"] == [{"type": "output_text", "text": message["content"][0]["text"], "annotations": []}]
    usage = obj["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0
    assert usage["input_tokens_details"] == {"cached_tokens": 0} and usage["output_tokens_details"] == {
        "reasoning_tokens": 0}
    assert obj["dspark_stats"]["rounds"] == 3

    streamed = await client.post(RESPONSES, json=body(instructions="Be brief.", temperature=0.5,
                                                      max_output_tokens=16, stream=True))
    assert streamed.headers["content-type"].startswith("text/event-stream") and "[DONE]" not in streamed.text
    events = _events(streamed.text)
    _check_events(events)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == \
        message["content"][0]["text"]
    final = events[-1]["response"]
    assert final["id"] == events[0]["response"]["id"] and _without_ids(final["output"]) == _without_ids(obj["output"])
    assert final["usage"] == obj["usage"] and final["dspark_stats"]["rounds"] == 3


async def test_length_finish_is_incomplete():
    """A reply cut by max_output_tokens: status incomplete, its reason, the message marked incomplete."""
    engine = FakeEngine(lambda request: Script(rounds=["one", " two", " three"]))
    app = create_app(settings(), engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        obj = (await c.post(RESPONSES, json=body(max_output_tokens=2))).json()
        events = _events((await c.post(RESPONSES, json=body(max_output_tokens=2, stream=True))).text)
    _check_events(events)
    assert obj["status"] == "incomplete" and obj["incomplete_details"] == {"reason": "max_output_tokens"}
    assert obj["output"][0]["status"] == "incomplete" and obj["output"][0]["content"][0]["text"] == "one two"
    assert events[-1]["type"] == "response.incomplete" and events[-1]["response"]["status"] == "incomplete"
    assert _without_ids(events[-1]["response"]["output"]) == _without_ids(obj["output"])


def _sdk_items(response) -> list[dict]:
    """The output items of an SDK response without ids (and without the None fields the parsed form adds)."""
    return _without_ids([item.model_dump(exclude_none=True) for item in response.output])


def _sdk(app) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")
    return openai.AsyncOpenAI(base_url="http://127.0.0.1/v1", api_key="unused", http_client=http, max_retries=0)


async def test_function_call_round_trip_through_the_sdk():
    """A tool call as a function_call item (the SDK's stream accumulates to the non-streamed response); its
    output sent back with the call gets the answer as a message."""
    def script(request):
        prompt = bytes(request.prompt_ids).decode(errors="replace")
        return Script(rounds=["It is 12 C."] if "12 C" in prompt else [CALL_TEXT[i:i + 7] for i in
                                                                       range(0, len(CALL_TEXT), 7)])

    sdk = _sdk(create_app(settings(), FakeEngine(script, info=replace(INFO, context_length=8192))))
    question = [{"role": "user", "content": "Weather in Paris?"}]
    reply = await sdk.responses.create(model="fake-model", input=question, tools=[WEATHER])
    async with sdk.responses.stream(model="fake-model", input=question, tools=[WEATHER]) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds  # (the parser releases a call's JSON once it is whole)
    assert [item.type for item in reply.output] == ["message", "function_call"]
    assert reply.output_text.strip() == "Let me check." and final.output_text == reply.output_text
    assert _sdk_items(final) == _sdk_items(reply)
    call = reply.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and call.id.startswith("fc_") and call.status == "completed"

    follow = question + [call.model_dump(exclude_none=True),
                         {"type": "function_call_output", "call_id": call.call_id, "output": "12 C"}]
    answer = await sdk.responses.create(model="fake-model", input=follow, tools=[WEATHER])
    assert [item.type for item in answer.output] == ["message"] and answer.output_text == "It is 12 C."


async def test_reasoning_item_and_count():
    """Thinking becomes a reasoning item before the message, counted in output_tokens_details."""
    rounds = ["<thi", "nk>Two and", " two.</th", "ink>It is", " 4."]
    engine = FakeEngine(lambda request: Script(rounds=rounds), template=THINKING_TEMPLATE)
    app = create_app(settings(), engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        obj = (await c.post(RESPONSES, json=body(reasoning={"effort": "high"}))).json()
        events = _events((await c.post(RESPONSES, json=body(stream=True))).text)
    _check_events(events)
    reasoning, message = obj["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_") and reasoning["summary"] == []
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Two and two."}]
    assert message["content"][0]["text"].strip() == "It is 4."
    assert obj["usage"]["output_tokens_details"]["reasoning_tokens"] > 0 and obj["reasoning"]["effort"] == "high"
    assert engine.encoded[0][1] == {"reasoning_effort": "high"}  # reached the template as chat's reasoning_effort
    kinds = [e["type"] for e in events]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    assert _without_ids(events[-1]["response"]["output"]) == _without_ids(obj["output"])


async def test_error_after_the_stream_started():
    """An engine failure mid-stream is one `error` event (sequence numbers continue), then the stream closes."""
    engine = FakeEngine(lambda request: Script(rounds=["a", "b", "c"], fail_after=2))
    app = create_app(settings(), engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        streamed = await c.post(RESPONSES, json=body(stream=True))
        plain = await c.post(RESPONSES, json=body())
        metrics = (await c.get("/metrics")).text
    events = _events(streamed.text)
    _check_events(events)
    assert events[-1]["type"] == "error" and events[-1]["code"] == "engine_error"
    assert "secret" not in events[-1]["message"] and "response.completed" not in [e["type"] for e in events]
    assert plain.status_code == 500 and plain.json()["error"]["code"] == "engine_error"
    assert 'dspark_requests_total{endpoint="responses",outcome="error"} 2.0' in metrics


async def test_documented_in_openapi(client):
    """The route documents its body, reply and events; the request schema says what the server takes."""
    schema = (await client.get("/openapi.json")).json()
    op = schema["paths"][RESPONSES]["post"]
    request = op["requestBody"]["content"]["application/json"]["schema"]
    assert request["properties"].keys() == request_schema()["properties"].keys()
    ok = op["responses"]["200"]["content"]
    assert ok["application/json"]["schema"] == response_schema()
    assert ok["text/event-stream"]["itemSchema"]["properties"]["data"]["contentSchema"] == event_schema()
    assert {"400", "404", "429", "503"} <= op["responses"].keys() and "422" not in op["responses"]
    valid = [body(), {"instructions": "x"}, body(tools=[WEATHER], tool_choice="required"),
             body(input=[{"type": "function_call_output", "call_id": "c", "output": "o"}]),
             body(tools=[WEATHER, {"type": "web_search"}])]
    invalid = [{"input": []}, body(previous_response_id="r"), body(tools=[{"type": "function"}]),
               body(tool_choice="required"), body(input=[{"role": "user", "content": [{"type": "input_image"}]}]),
               body(input=[{"type": "function_call", "call_id": "c", "name": "f"}])]
    for good in valid:
        jsonschema.validate(good, request)
        assert ResponsesRequest.model_validate(good)
    for bad in invalid:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, request)
