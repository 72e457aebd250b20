"""Templates belong to the model: what a client can send toward the chat template and the tokenizer.

- `chat_template_kwargs` reaches the template only through `TEMPLATE_FLAGS`, with scalar values;
  anything else (a template, tokenizer arguments) is ignored and reported, or refused when strict.
- Rendering and tokenizing run off the event loop, bounded in time and size: `/health` stays fast.
- Errors name the field the client sent and show no exception text, class names or paths.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from pathlib import Path
from typing import Any

import httpx
import jinja2
import pytest

from engine.api import EngineInputError
from server import prompt
from server.app import create_app
from server.policy import HEADER, MAX_HEADER_NAMES
from server.prompt import TEMPLATE_FLAGS
from tests.server.conftest import CHAT, COMPLETIONS, chat_body, live_server, settings
from tests.server.fake_engine import HANG_GUARD_S, FakeEngine

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).resolve().parents[2] / "server"
INTERNALS = re.compile(r"Error\b|Exception|Traceback|TextEncodeInput|Undefined|jinja|File \"|/\w+/\w+\.py|\bat 0x")
# What clients have sent in `chat_template_kwargs` to drive the template or the tokenizer.
FOREIGN_KWARGS = {
    "chat_template": "{% for i in range(10**9) %}x{% endfor %}", "tokenize": False, "truncation": True,
    "max_length": 1, "padding": "max_length", "return_tensors": "np", "return_dict": True,
    "add_generation_prompt": False, "continue_final_message": True, "tools": [{"type": "function"}],
    "documents": [{"text": "d"}],
}


def _client(engine: FakeEngine, **overrides: Any) -> httpx.AsyncClient:
    app = create_app(settings(**overrides), engine)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


def _error(r: httpx.Response, status: int = 400) -> dict[str, Any]:
    """The error object of `r`, after checking the status and that it reveals nothing internal."""
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert not INTERNALS.search(error["message"]), error
    return error


# chat_template_kwargs


async def test_only_template_flags_reach_the_template():
    """A client template and tokenizer arguments are dropped and reported; the flags pass."""
    engine = FakeEngine()
    async with _client(engine) as c:
        r = await c.post(CHAT, json=chat_body(chat_template_kwargs={"enable_thinking": False, **FOREIGN_KWARGS}))
    assert r.status_code == 200, r.text
    assert engine.encoded[-1][1] == {"enable_thinking": False}
    reported = r.headers[HEADER].split(", ")
    assert reported == [f"chat_template_kwargs.{key}" for key in FOREIGN_KWARGS]


async def test_every_flag_passes_and_null_means_unset(client, engine):
    """Each allowed flag reaches the template as sent; a null flag is left out."""
    flags = {flag: f"v{i}" for i, flag in enumerate(TEMPLATE_FLAGS)}
    assert (await client.post(CHAT, json=chat_body(chat_template_kwargs=flags))).status_code == 200
    assert engine.encoded[-1][1] == flags
    assert (await client.post(CHAT, json=chat_body(chat_template_kwargs={"thinking": None}))).status_code == 200
    assert engine.encoded[-1][1] == {}


@pytest.mark.parametrize("value", [{"a": 1}, [1], 1e999])
async def test_flag_values_are_scalars(client, value):
    """Objects and arrays (structures for Jinja to walk) and non-finite numbers are refused."""
    raw = json.dumps(chat_body(chat_template_kwargs={"enable_thinking": value})).replace("Infinity", "1e999")
    r = await client.post(CHAT, content=raw, headers={"Content-Type": "application/json"})
    error = _error(r)
    assert error["param"] == "chat_template_kwargs.enable_thinking"
    assert error["code"] in ("invalid_type", "invalid_value")


@pytest.mark.parametrize("key", sorted(FOREIGN_KWARGS))
async def test_strict_refuses_other_keys(key):
    """--strict-params: any other key is 400 unrecognized_argument naming it."""
    async with _client(FakeEngine(), strict_params=True) as c:
        r = await c.post(CHAT, json=chat_body(chat_template_kwargs={key: FOREIGN_KWARGS[key]}))
    error = _error(r)
    assert (error["param"], error["code"]) == (f"chat_template_kwargs.{key}", "unrecognized_argument")


def test_only_the_allow_list_feeds_the_template():
    """`encode_chat` is called in one place, and its kwargs come only from `template_kwargs`."""
    callers = [p for p in SERVER.rglob("*.py") if "encode_chat(" in p.read_text() and p.name != "runtime.py"]
    assert callers == [SERVER / "prompt.py"]
    source = (SERVER / "prompt.py").read_text()
    assert source.count("encode_chat(") == 1 and "kwargs = template_kwargs(req)" in source
    assert not any("chat_template_kwargs" in p.read_text() for p in (SERVER / "routes").glob("*.py"))


# Off the event loop


def test_health_answers_while_a_render_blocks():
    """While a render blocks its thread, /health from another client is answered: the render is off
    the event loop (were it on the loop, /health would wait for the gate this test opens after)."""
    gate = threading.Event()
    engine = FakeEngine(encode_gate=gate)
    with live_server(engine) as live, httpx.Client(base_url=live.base_url, timeout=HANG_GUARD_S) as poller:
        result: dict[str, Any] = {}
        slow = threading.Thread(target=lambda: result.update(r=httpx.post(f"{live.base_url}{CHAT}",
                                                                          json=chat_body(), timeout=HANG_GUARD_S)))
        slow.start()
        try:
            assert engine.encode_started.wait(HANG_GUARD_S)
            assert all(poller.get("/health").status_code == 200 for _ in range(5))
            assert slow.is_alive() and "r" not in result  # the render is still blocked
        finally:
            gate.set()
            slow.join(HANG_GUARD_S)
    assert result["r"].status_code == 200


async def test_a_render_past_the_time_bound_is_400(monkeypatch):
    """A render slower than RENDER_TIMEOUT_S is answered 400 prompt_render_timeout (chat and completions)."""
    monkeypatch.setattr(prompt, "RENDER_TIMEOUT_S", 0.2)
    gate = threading.Event()  # never opened while the requests wait: the render cannot finish in time
    try:
        async with _client(FakeEngine(encode_gate=gate)) as c:
            chat = await c.post(CHAT, json=chat_body())
            text = await c.post(COMPLETIONS, json={"prompt": "hi"})
    finally:
        gate.set()
    assert (_error(chat)["code"], _error(chat)["param"]) == ("prompt_render_timeout", "messages")
    assert (_error(text)["code"], _error(text)["param"]) == ("prompt_render_timeout", "prompt")


async def test_a_huge_prompt_is_refused_where_it_is_made(client, engine):
    """Token ids beyond the context window are refused before the engine sees them, naming the field."""
    r = await client.post(COMPLETIONS, json={"prompt": [1] * 300, "max_tokens": 1})  # the fake's window: 256
    error = _error(r)
    assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded")
    assert not engine.submitted


# Errors


@pytest.mark.parametrize("prompt_value", ["", [""], [], [[]]])
async def test_empty_completion_prompt_blames_prompt(client, prompt_value):
    """An empty prompt names `prompt` (the field this endpoint has), not `messages`."""
    error = _error(await client.post(COMPLETIONS, json={"prompt": prompt_value}))
    assert error["param"] == "prompt"


async def test_prompt_that_tokenizes_to_nothing_blames_prompt(client, engine, monkeypatch):
    """Text whose tokenization is empty is refused by the server before submit, naming `prompt`."""
    monkeypatch.setattr(engine, "encode_text", lambda text: [])
    error = _error(await client.post(COMPLETIONS, json={"prompt": " "}))
    assert (error["param"], error["code"]) == ("prompt", "invalid_value")
    assert not engine.submitted


@pytest.mark.parametrize(("path", "raw", "param"), [
    (CHAT, '{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages[0].content"),
    (CHAT, '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
     "messages[0].content[0].text"),
    (COMPLETIONS, '{"prompt": "x\\udc00"}', "prompt"),
    (CHAT, '{"messages": [{"role": "user", "content": "a"}], "\\ud800": 1}', None),
])
async def test_lone_surrogate_is_a_plain_400(client, engine, path, raw, param):
    """A lone surrogate is refused before the tokenizer, naming the field; a valid pair is served."""
    error = _error(await client.post(path, content=raw.encode(), headers={"Content-Type": "application/json"}))
    assert (error["param"], error["code"]) == (param, "invalid_value")
    assert "surrogate" in error["message"] and not engine.encoded
    pair = '{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    assert (await client.post(CHAT, content=pair, headers={"Content-Type": "application/json"})).status_code == 200


@pytest.mark.parametrize(("cause", "shown"), [
    (TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]"), None),
    (jinja2.exceptions.UndefinedError("'dict object' has no attribute 'x'"), None),
    (ValueError("file /opt/models/x/tokenizer.json is broken"), None),
    (jinja2.exceptions.TemplateError("Conversation roles must alternate user/assistant"),
     "Conversation roles must alternate user/assistant"),
])
async def test_template_and_tokenizer_failures_are_sanitized(caplog, cause, shown):
    """A library failure is a 400 in our words (the details go to the log); a template's own
    `raise_exception` message, written for users, is passed on."""
    engine = FakeEngine()

    def failing(messages, kwargs=None):
        raise EngineInputError(f"could not apply the chat template: {cause}", param="messages") from cause

    engine.encode_chat = failing  # type: ignore[method-assign]
    caplog.set_level(logging.INFO, logger="server.errors")
    async with _client(engine) as c:
        error = _error(await c.post(CHAT, json=chat_body()))
    assert error["param"] == "messages" and "chat template could not render" in error["message"]
    assert (shown in error["message"]) if shown else ("says" not in error["message"])
    assert str(cause) in caplog.text


async def test_our_engine_messages_are_kept(client):
    """An engine input error without a library cause keeps its text (it is ours)."""
    error = _error(await client.post(CHAT, json=chat_body("nul\x00here")))
    assert error["message"] == "prompt contains a NUL character"


@pytest.mark.parametrize(("levels", "status"), [(10, 200), (1_000, 400), (100_000, 400)])
async def test_nesting_depths(caplog, levels, status):
    """Nesting of 10 levels is served (the unknown key ignored); 1,000 and 100,000 get 400, no traceback."""
    nested = "[" * levels + "]" * levels
    raw = json.dumps(chat_body()).encode()[:-1] + b', "deep": ' + nested.encode() + b"}"
    async with _client(FakeEngine(), max_body_bytes=1 << 20) as c:
        r = await c.post(CHAT, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    if status == 400:
        assert _error(r)["code"] == "invalid_json"
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR or rec.exc_info]


async def test_ignored_names_make_a_safe_header(client):
    """Field names of any text (empty, spaces, non-Latin-1, line breaks) give a valid, bounded header."""
    odd = {"": 1, " x ": 2, "€uro": 3, "a\r\nSet-Cookie: x": 4, "k" * 500: 5}
    many = {f"f{i}": i for i in range(MAX_HEADER_NAMES + 5)}
    r = await client.post(CHAT, json=chat_body(**odd, **many))
    assert r.status_code == 200, r.text
    value = r.headers[HEADER]
    assert value.isascii() and value == value.strip() and "\n" not in value and len(value) < 3000
    assert value.startswith("'', ' x ', '\\u20acuro', 'a\\r\\nSet-Cookie: x', kkk") and value.endswith(f"... ({len(odd) + len(many) - MAX_HEADER_NAMES} more)")
