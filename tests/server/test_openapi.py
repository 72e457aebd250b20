"""The OpenAPI schema documents the statuses the server really returns."""

from __future__ import annotations

import pytest

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
    assert {"messages", "model", "stream_options", "chat_template_kwargs", "dspark", "top_k", "min_p"} <= props.keys()
    assert schema["components"]["schemas"][name]["additionalProperties"] is False
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
