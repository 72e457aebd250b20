"""The OpenAPI schema documents the statuses the server really returns."""

from __future__ import annotations

import re

import pytest

from server.prompt import TEMPLATE_FLAGS

pytestmark = pytest.mark.anyio


async def test_schema_lists_real_statuses(client):
    """Generation routes document 400/401/404/413/429/503 with the error body, and never 422."""
    schema = (await client.get("/openapi.json")).json()
    for path in ("/v1/chat/completions", "/v1/completions"):
        responses = schema["paths"][path]["post"]["responses"]
        assert {"200", "400", "401", "404", "413", "429", "500", "503"} <= responses.keys()
        assert "422" not in responses
        assert responses["429"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
        assert "text/event-stream" in responses["200"]["content"]
    assert all("422" not in op["responses"] for ops in schema["paths"].values() for op in ops.values())
    assert "503" in schema["paths"]["/health"]["get"]["responses"]


async def test_schema_documents_request_bodies(client):
    """Request bodies reference complete request schemas, extension fields included."""
    schema = (await client.get("/openapi.json")).json()
    body = schema["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    name = body["$ref"].rsplit("/", 1)[1]
    props = schema["components"]["schemas"][name]["properties"]
    assert {"messages", "model", "stream_options", "chat_template_kwargs", "dspark", "top_k", "min_p", "tools",
            "tool_choice", "logprobs", "top_logprobs", "presence_penalty", "repetition_penalty"} <= props.keys()
    assert "model" not in schema["components"]["schemas"][name].get("required", [])  # the served model by default
    for ref in _refs(schema):
        assert ref.rsplit("/", 1)[1] in schema["components"]["schemas"], ref


async def test_docs_page_served(client):
    """The interactive docs are served."""
    assert (await client.get("/docs")).status_code == 200


def _refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _components(strict: bool = False, engine=None) -> dict:
    """The component schemas of an app over `engine` (a ready fake by default) under the policy."""
    from server.app import create_app
    from server.openapi import build
    from tests.server.conftest import settings
    from tests.server.fake_engine import FakeEngine

    return build(create_app(settings(strict_params=strict), engine or FakeEngine()))["components"]["schemas"]


def _branches(prop: dict) -> list[dict]:
    return prop.get("anyOf", [prop])


def test_refusals_are_schema_rules():
    """What the server refuses is written as JSON Schema, not only in descriptions."""
    chat, text = (_components()[name]["properties"] for name in ("ChatCompletionRequest", "CompletionRequest"))
    assert chat["n"]["enum"] == [1, None] and text["best_of"]["enum"] == [1, None]
    assert _branches(chat["tool_choice"])[0]["enum"] == ["none", "auto", "required", None]
    assert _branches(chat["function_call"])[0]["enum"] == ["none", "auto", None]
    for body in (chat, text):
        formats = _branches(body["response_format"])
        assert formats[0]["properties"]["type"]["enum"] == ["text", "json_object"]
        assert formats[1]["properties"]["type"]["const"] == "json_schema" and "json_schema" in formats[1]["required"]
    assert chat["audio"]["type"] == "null"
    assert text["echo"]["enum"] == [False, None] and text["suffix"]["type"] == "null"
    stop = {b.get("type"): b for b in _branches(chat["stop"])}
    assert stop["array"]["maxItems"] == 64 and stop["array"]["items"]["minLength"] == 1 and stop["string"]["minLength"] == 1
    assert {b.get("minLength") or b.get("minItems") for b in _branches(text["prompt"])} == {1}
    bias = next(b for b in _branches(chat["logit_bias"]) if b.get("type") == "object")
    assert bias["additionalProperties"] == {"type": "number", "minimum": -100.0, "maximum": 100.0}
    max_tokens = next(b for b in _branches(chat["max_tokens"]) if b.get("type") == "integer")
    assert max_tokens["minimum"] == 1 and max_tokens["maximum"] == 255  # the fake's window minus one token
    assert not re.search(r"'(ge|le|gt|lt)':", str(_components()))  # pydantic's names: validators would skip them


def test_cross_field_rules_are_stated():
    """`stream_options` needs `stream: true` (a JSON Schema rule); the two token limits must agree (described);
    non-assistant turns need content."""
    components = _components()
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        schema = components[name]
        assert schema["if"]["required"] == ["stream_options"] and schema["then"]["properties"]["stream"] == {"const": True}
    assert "must be equal" in components["ChatCompletionRequest"]["properties"]["max_completion_tokens"]["description"]
    message = components["ChatMessage"]
    assert message["required"] == ["role"] and message["then"] == {"required": ["content"]}


def test_schema_follows_the_policy():
    """Tolerant: request objects allow other properties. --strict-params: none do, the inert OpenAI fields are
    listed with their accepted values, `stop` takes 4, and tool-call arguments are text only."""
    tolerant, strict = _components(), _components(strict=True)
    for name in ("ChatCompletionRequest", "CompletionRequest", "ChatMessage", "ToolDef", "ChatTemplateKwargs"):
        assert tolerant[name]["additionalProperties"] is True and strict[name]["additionalProperties"] is False
    assert "store" not in tolerant["ChatCompletionRequest"]["properties"]
    props = strict["ChatCompletionRequest"]["properties"]
    assert props["store"]["enum"] == [False, None] and props["service_tier"]["type"] == "null"
    assert next(b for b in props["stop"]["anyOf"] if b.get("type") == "array")["maxItems"] == 4
    arguments = [b["type"] for b in _branches(tolerant["FunctionCall"]["properties"]["arguments"])]
    assert arguments == ["string", "object", "null"]
    assert [b["type"] for b in _branches(strict["FunctionCall"]["properties"]["arguments"])] == ["string", "null"]
    assert "x-tolerant-only" not in str(tolerant)
    assert set(strict["ChatTemplateKwargs"]["properties"]) == set(TEMPLATE_FLAGS)


def test_model_bounds_once_loaded():
    """With a vocabulary, token ids are bounded by it; the schema is cached only once the model is loaded."""
    import dataclasses

    from server.app import create_app
    from server.openapi import build
    from tests.server.conftest import settings
    from tests.server.fake_engine import INFO, FakeEngine

    chat = _components(engine=FakeEngine(info=dataclasses.replace(INFO, vocab_size=250)))["CompletionRequest"]
    bias = next(b for b in chat["properties"]["logit_bias"]["anyOf"] if b.get("type") == "object")
    assert bias["propertyNames"]["pattern"] == "^(?:0|[1-9][0-9]{0,1}|[1-1][0-9]{2}|2[0-3][0-9]{1}|24[0-8]|249)$"
    ids = next(b for b in chat["properties"]["prompt"]["anyOf"] if b.get("items", {}).get("type") == "integer")
    assert ids["items"]["maximum"] == 249
    loading = create_app(settings(), FakeEngine(state="loading"))
    assert "logit_bias" in str(build(loading)) and loading.openapi_schema is None


def test_streams_are_documented_as_server_sent_events():
    """200 `text/event-stream` has an `itemSchema` per event: a chunk, an error, or `[DONE]`."""
    from server.app import create_app
    from server.openapi import build
    from tests.server.conftest import settings
    from tests.server.fake_engine import FakeEngine

    schema = build(create_app(settings(), FakeEngine()))
    assert schema["openapi"].startswith("3.1")
    for path, chunk in (("/v1/chat/completions", "ChatCompletionChunk"), ("/v1/completions", "CompletionResponse")):
        stream = schema["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]
        data = stream["itemSchema"]["properties"]["data"]["anyOf"]
        assert data[0]["const"] == "[DONE]"
        assert [d["contentSchema"]["$ref"].rsplit("/", 1)[1] for d in data[1:]] == [chunk, "ErrorResponse"]
        assert all(d["contentMediaType"] == "application/json" for d in data[1:])
