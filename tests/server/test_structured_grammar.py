"""The grammars server/structured.py builds, checked with llguidance over a byte tokenizer (every
byte a token), so a grammar is exercised on exact texts: what a parser of that tool-call format
accepts passes, near misses do not."""

from __future__ import annotations

import json

import llguidance
import pytest

from engine.api import GrammarSpec
from engine.grammar import compile_grammar
from server.errors import APIError
from server.prompt import OutputSpec
from server.protocol import ChatCompletionRequest
from server.structured import chat_grammar, format_grammar

EOS = 256
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]


class Bytes:
    eos_token_id, bos_token_id, special_token_ids = EOS, None, [EOS]
    tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]

    def __call__(self, text):
        return list(text.encode() if isinstance(text, str) else text)


TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Bytes()), n_vocab=EOS + 1)


def matches(grammar: GrammarSpec, text: str) -> bool:
    """Whether the whole of `text` is a complete sentence of `grammar`."""
    matcher = llguidance.LLMatcher(TOKENIZER, compile_grammar(grammar))
    data = list(text.encode())
    return matcher.validate_tokens(data) == len(data) and matcher.consume_tokens(data) and matcher.is_accepting()


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def spec(template: str | None = None, think: bool = False) -> OutputSpec:
    return OutputSpec(chat_template=template, tools_requested=True, thinking=think, max_calls=None,
                      prompt_ends_in_think=think, think_end_id=None)


HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME_CALL = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def test_named_function_in_hermes_markup():
    """A named function: exactly one call to it (the fallback format is Hermes)."""
    g = chat_grammar(request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}),
                     spec())
    assert g.param == "tool_choice" and matches(g, HERMES_CALL)
    assert not matches(g, TIME_CALL) and not matches(g, HERMES_CALL + "\n" + HERMES_CALL)
    assert not matches(g, HERMES_CALL.replace('"Paris"', "5")) and not matches(g, "Sure! " + HERMES_CALL)


def test_required_calls_any_tool_one_or_more_times():
    g = chat_grammar(request(tools=TOOLS, tool_choice="required"), spec())
    assert matches(g, TIME_CALL) and matches(g, HERMES_CALL + "\n" + TIME_CALL) and not matches(g, "")
    one = chat_grammar(request(tools=TOOLS, tool_choice="required", parallel_tool_calls=False), spec())
    assert matches(one, TIME_CALL) and not matches(one, HERMES_CALL + "\n" + TIME_CALL)


def test_legacy_function_call_and_llama3_markup():
    """Llama 3 templates call with a bare {"name", "parameters"} object; the legacy field forces too."""
    g = chat_grammar(request(functions=[TOOLS[0]["function"]], function_call={"name": "get_weather"}),
                     spec('{{ "<|python_tag|>" }}'))
    assert g.param == "function_call"
    assert matches(g, '{"name": "get_weather", "parameters": {"city": "Rome"}}')
    assert not matches(g, '{"name": "get_weather", "arguments": {"city": "Rome"}}')


def test_format_without_a_grammar_for_forced_calls_is_refused():
    with pytest.raises(APIError) as info:
        chat_grammar(request(tools=TOOLS, tool_choice="required"), spec("[TOOL_CALLS] {{ x }}"))
    assert info.value.status == 400 and "mistral" in info.value.message


def test_response_format_and_an_open_think_block():
    """json_schema as given; json_object is any object; after an opened <think> the grammar closes it
    first; a forced call wins over response_format; text and no format mean no grammar."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    g = chat_grammar(request(response_format=fmt), spec())
    assert g.kind == "json_schema" and json.loads(g.source) == schema and matches(g, '{"a": 1}')
    thinking = chat_grammar(request(response_format=fmt), spec(think=True))
    assert matches(thinking, '</think>\n\n{"a": 1}') and not matches(thinking, '{"a": 1}')
    obj = format_grammar(request(response_format={"type": "json_object"}))
    assert matches(obj, '{"x": [1, {}]}') and not matches(obj, "[1]")
    call = chat_grammar(request(response_format=fmt, tools=TOOLS, tool_choice="required"), spec(think=True))
    assert matches(call, "</think>\n\n" + TIME_CALL)
    assert format_grammar(request(response_format={"type": "text"})) is None and format_grammar(request()) is None
