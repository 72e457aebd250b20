"""The output parsers (`server.outputs`): reasoning / content / tool-call splitting, for every chunking.

The engine releases several tokens per round, so chunk boundaries are arbitrary. For each case below the
parsed reply must be the same whether the text arrives whole, cut at any one point, cut at any two points,
or one character at a time, and must equal the expected reply written by hand (which spells out exactly
which characters are content: nothing lost, nothing duplicated).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from server.outputs import (
    Content,
    Event,
    Message,
    OutputParser,
    Reasoning,
    ToolCallArgs,
    ToolCallStart,
    accumulate,
    detect_format,
    hermes_tool_system_prompt,
    make_parser,
    merge,
)

# --- chat template excerpts (written for these tests, in the style of each family) ---------------------

QWEN25_TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\\n' + (messages[0].content if messages[0].role == 'system' else 'You are a helpful assistant.') }}
{{- "\\n\\n# Tools\\n\\nFunction signatures are inside <tools></tools>:\\n<tools>" }}
{%- for tool in tools %}{{- "\\n" + tool | tojson }}{%- endfor %}
{{- "\\n</tools>\\n\\nCall a function like this:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- endif %}
{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

QWEN3_TEMPLATE = """{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{{- '<tool_call>\\n{"name": "' + tool_call.function.name + '", "arguments": ' + tool_call.function.arguments | tojson + '}\\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}"""

LLAMA31_TEMPLATE = """{{- bos_token }}
{%- if builtin_tools is defined or tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
{%- for message in messages %}
{%- if 'tool_calls' in message %}
{%- set tool_call = message.tool_calls[0].function %}
{%- if builtin_tools is defined and tool_call.name in builtin_tools %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n<|python_tag|>' + tool_call.name + '.call(' }}
{%- else %}
{{- '{"name": "' + tool_call.name + '", "parameters": ' + tool_call.arguments | tojson + '}' }}
{%- endif %}
{{- "<|eom_id|>" if builtin_tools is defined else "<|eot_id|>" }}
{%- endif %}
{%- endfor %}"""

LLAMA32_TEMPLATE = """{%- for message in messages %}
{%- if message.role == "tool" or message.role == "ipython" %}
{{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" + message.content | tojson + "<|eot_id|>" }}
{%- elif 'tool_calls' in message %}
{{- '{"name": "' + message.tool_calls[0].function.name + '", "parameters": ' }}
{{- message.tool_calls[0].function.arguments | tojson + "}<|eot_id|>" }}
{%- endif %}
{%- endfor %}"""

MISTRAL_V3_TEMPLATE = """{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls is defined %}
{{- "[TOOL_CALLS] [" }}
{%- for tool_call in message.tool_calls %}
{{- '{"name": "' + tool_call.function.name + '", "arguments": ' + tool_call.function.arguments | tojson + '}' }}
{%- endfor %}
{{- "]" + eos_token }}
{%- endif %}
{%- endfor %}"""

MISTRAL_V11_TEMPLATE = """{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}
{%- for tool in message.tool_calls %}
{{- "[TOOL_CALLS]" + tool.function.name + "[ARGS]" + tool.function.arguments | tojson }}
{%- endfor %}{{- eos_token }}
{%- endif %}
{%- endfor %}"""

CHATML_TEMPLATE = """{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + \
'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"""


@pytest.mark.parametrize(
    ("template", "family"),
    [
        (QWEN25_TEMPLATE, "hermes"),
        (QWEN3_TEMPLATE, "hermes"),
        (LLAMA31_TEMPLATE, "llama3"),
        (LLAMA32_TEMPLATE, "llama3"),
        (MISTRAL_V3_TEMPLATE, "mistral"),
        (MISTRAL_V11_TEMPLATE, "mistral"),
        (CHATML_TEMPLATE, None),
        ("", None),
        (None, None),
    ],
)
def test_detect_format(template: str | None, family: str | None) -> None:
    assert detect_format(template) == family


def test_hermes_tool_system_prompt() -> None:
    tools = [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Météo", "parameters": {"type": "object"}},
        },
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}},
    ]
    prompt = hermes_tool_system_prompt(tools)
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in prompt
    listed = prompt.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line) for line in listed] == [tool["function"] for tool in tools]


# --- harness -------------------------------------------------------------------------------------------

Factory = Callable[[], OutputParser]


def ids() -> Callable[[], str]:
    """A deterministic id factory: call_000...0, call_000...1, ..."""
    counter = itertools.count()
    return lambda: f"call_{next(counter):024x}"


def parser(
    template: str | None,
    tools: bool = True,
    thinking: bool = False,
    max_calls: int | None = None,
    in_think: bool = False,
) -> Factory:
    """A factory of fresh parsers for one configuration."""
    return lambda: make_parser(template, tools, thinking, max_calls, in_think, id_factory=ids())


def run(make: Factory, chunks: list[str]) -> list[Event]:
    """All events of one parser fed `chunks`, then finished."""
    p = make()
    events = [event for chunk in chunks for event in p.push(chunk)]
    return events + p.finish()


def chunkings(text: str) -> Iterator[list[str]]:
    """Whole; every single cut; every pair of cuts; one character at a time."""
    n = len(text)
    yield [text]
    for i in range(1, n):
        yield [text[:i], text[i:]]
    for i in range(1, n):
        for j in range(i + 1, n):
            yield [text[:i], text[i:j], text[j:]]
    yield list(text)


def violations(make: Factory, text: str, limit: int = 3) -> list[str]:
    """Chunkings whose events differ from the unchunked ones (after `merge`), or that emit empty pieces."""
    reference = merge(run(make, [text]))
    bad = []
    for chunks in chunkings(text):
        events = run(make, chunks)
        empty = [e for e in events if isinstance(e, (Content, Reasoning, ToolCallArgs)) and not e.text]
        if merge(events) != reference or empty:
            bad.append(repr(chunks))
            if len(bad) >= limit:
                break
    return bad


def call(name: str, args: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """An expected OpenAI tool call, with the canonical arguments string and the test ids."""
    arguments = json.dumps(args, ensure_ascii=False)
    return {"id": f"call_{index:024x}", "type": "function", "function": {"name": name, "arguments": arguments}}


def calls(*pairs: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Expected tool calls, indexed in order."""
    return [call(name, args, i) for i, (name, args) in enumerate(pairs)]


# --- cases: (factory, output text, expected reply) ------------------------------------------------------

HERMES = parser(QWEN25_TEMPLATE)
THINK_HERMES = parser(QWEN3_TEMPLATE, thinking=True)
LLAMA = parser(LLAMA31_TEMPLATE)
MISTRAL = parser(MISTRAL_V11_TEMPLATE)

W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
T = '{"name": "get_time", "arguments": {"tz": "CET"}}'
WEATHER, TIME = ("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})
TRICKY = (
    '{"name": "run", "arguments": {"code": "if (a) { return \\"</tool_call>}\\"; }", "n": {"d": [1, {"k": "]}"}]}}}'
)
TRICKY_ARGS = {"code": 'if (a) { return "</tool_call>}"; }', "n": {"d": [1, {"k": "]}"}]}}
UNICODE = '{"name": "traduire", "arguments": {"texte": "héllo wörld — 日本語 🎉", "\\u00e9": "\\ud83d\\ude00"}}'
UNICODE_ARGS = {"texte": "héllo wörld — 日本語 🎉", "é": "😀"}

CASES: dict[str, tuple[Factory, str, Message]] = {
    "hermes-plain": (HERMES, "Hello, world! No tags < here >.", Message("Hello, world! No tags < here >.", None)),
    "hermes-before": (
        HERMES,
        f"Let me check.\n<tool_call>\n{W}\n</tool_call>",
        Message("Let me check.\n", None, calls(WEATHER)),
    ),
    "hermes-around": (
        HERMES,
        f"A <tool_call>{W}</tool_call> B <tool_call>{T}</tool_call> C",
        Message("A  B  C", None, calls(WEATHER, TIME)),
    ),
    "hermes-parallel": (
        HERMES,
        f"<tool_call>\n{W}\n</tool_call>\n\n<tool_call>\n{T}\n</tool_call>\n",
        Message(None, None, calls(WEATHER, TIME)),
    ),
    "hermes-malformed": (
        HERMES,
        'x<tool_call>{"name": "f", "arguments": {bad}}</tool_call>y',
        Message('x<tool_call>{"name": "f", "arguments": {bad}}</tool_call>y', None),
    ),
    "hermes-no-name": (
        HERMES,
        f'<tool_call>{{"arguments": {{}}}}</tool_call> <tool_call>{W}</tool_call>',
        Message('<tool_call>{"arguments": {}}</tool_call> ', None, calls(WEATHER)),
    ),
    "hermes-unclosed": (
        HERMES,
        f'ok <tool_call>{W}</tool_call> <tool_call>{{"name": "f", "arguments": {{"a": 1}}',
        Message('ok  <tool_call>{"name": "f", "arguments": {"a": 1}', None, calls(WEATHER)),
    ),
    "hermes-partial-tag-end": (HERMES, "text then <tool_ca", Message("text then <tool_ca", None)),
    "hermes-near-tags": (
        HERMES,
        "a <tool> <tool_callx> </tool_call>",
        Message("a <tool> <tool_callx> </tool_call>", None),
    ),
    "hermes-tricky-strings": (
        HERMES,
        f"<tool_call>{TRICKY}</tool_call>",
        Message(None, None, calls(("run", TRICKY_ARGS))),
    ),
    "hermes-unicode": (
        HERMES,
        f"Voilà 🌍 <tool_call>{UNICODE}</tool_call>",
        Message("Voilà 🌍 ", None, calls(("traduire", UNICODE_ARGS))),
    ),
    "hermes-string-args": (
        HERMES,
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": [1, 2]}"}</tool_call>',
        Message(None, None, calls(("f", {"a": [1, 2]}))),
    ),
    "hermes-max-calls": (
        parser(QWEN25_TEMPLATE, max_calls=1),
        f"<tool_call>{W}</tool_call> mid <tool_call>{T}</tool_call> end",
        Message(" mid  end", None, calls(WEATHER)),
    ),
    "hermes-fallback-no-template": (
        parser(CHATML_TEMPLATE),
        f"<tool_call>{W}</tool_call>",
        Message(None, None, calls(WEATHER)),
    ),
    "tools-not-requested": (
        parser(QWEN25_TEMPLATE, tools=False),
        f"<tool_call>{W}</tool_call>",
        Message(f"<tool_call>{W}</tool_call>", None),
    ),
    "think-then-call": (
        THINK_HERMES,
        f"<think>\nI could use <tool_call>{T}</tool_call> here.\n</think>\n\nSure.<tool_call>\n{W}\n</tool_call>",
        Message("Sure.", f"I could use <tool_call>{T}</tool_call> here.", calls(WEATHER)),
    ),
    "think-in-prompt": (
        parser(QWEN3_TEMPLATE, thinking=True, in_think=True),
        "Hmm...\n</think>\n\nAnswer",
        Message("Answer", "Hmm..."),
    ),
    "think-repeated-open": (parser(None, tools=False, in_think=True), "\n<think>\nHmm</think>A", Message("A", "Hmm")),
    "think-unclosed": (THINK_HERMES, "<think>\nstill thinking </thi", Message(None, "still thinking </thi")),
    "think-none": (THINK_HERMES, "Plain <think> answer.", Message("Plain <think> answer.", None)),
    "think-empty": (THINK_HERMES, "<think>\n\n</think>\n\nHi there", Message("Hi there", None)),
    "think-leading-space": (
        parser(None, tools=False, thinking=True),
        "  <think>a b  </think> c ",
        Message("c ", "a b"),
    ),
    "think-off": (parser(None, tools=False), "<think>x</think>y", Message("<think>x</think>y", None)),
    "think-then-llama": (
        parser(LLAMA31_TEMPLATE, thinking=True),
        '<think>plan</think>\n{"name": "get_weather", "parameters": {"city": "Paris"}}',
        Message(None, "plan", calls(WEATHER)),
    ),
    "llama-call": (
        LLAMA,
        ' {"name": "get_weather", "parameters": {"city": "Paris"}}',
        Message(None, None, calls(WEATHER)),
    ),
    "llama-python-tag-parallel": (
        LLAMA,
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "arguments": {"tz": "CET"}}',
        Message(None, None, calls(WEATHER, TIME)),
    ),
    "llama-text-first": (
        LLAMA,
        'The call is {"name": "get_weather", "parameters": {}}',
        Message('The call is {"name": "get_weather", "parameters": {}}', None),
    ),
    "llama-not-a-call": (LLAMA, ' {"answer": "}"} trailing', Message(' {"answer": "}"} trailing', None)),
    "llama-unclosed": (
        LLAMA,
        '{"name": "f", "parameters": {"a": "}',
        Message('{"name": "f", "parameters": {"a": "}', None),
    ),
    "llama-braces-in-strings": (
        LLAMA,
        '{"name": "f", "parameters": {"s": "a}b{c\\"}", "u": "日本"}}; then text',
        Message(" then text", None, calls(("f", {"s": 'a}b{c"}', "u": "日本"}))),
    ),
    "llama-builtin": (
        LLAMA,
        '<|python_tag|>brave_search.call(query="x")',
        Message('<|python_tag|>brave_search.call(query="x")', None),
    ),
    "mistral-array": (
        parser(MISTRAL_V3_TEMPLATE),
        'Sure.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"tz": "CET"}}]',
        Message("Sure.", None, calls(WEATHER, TIME)),
    ),
    "mistral-v11": (
        MISTRAL,
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}',
        Message(None, None, calls(WEATHER, TIME)),
    ),
    "mistral-no-args-tag": (
        MISTRAL,
        'ok [TOOL_CALLS]get_weather{"city": "Paris"}',
        Message("ok ", None, calls(WEATHER)),
    ),
    "mistral-call-id": (
        MISTRAL,
        '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}',
        Message(None, None, calls(WEATHER)),
    ),
    "mistral-malformed": (
        MISTRAL,
        '[TOOL_CALLS] [{"name": "f", "arguments": {bad}}] after',
        Message('[TOOL_CALLS] [{"name": "f", "arguments": {bad}}] after', None),
    ),
    "mistral-prose": (MISTRAL, "[TOOL_CALLS]Sorry, no tool.", Message("[TOOL_CALLS]Sorry, no tool.", None)),
    "mistral-unclosed": (
        MISTRAL,
        '[TOOL_CALLS][{"name": "f", "arguments": {"x": "]}"}}',
        Message('[TOOL_CALLS][{"name": "f", "arguments": {"x": "]}"}}', None),
    ),
    "mistral-max-calls": (
        parser(MISTRAL_V3_TEMPLATE, max_calls=1),
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]',
        Message(None, None, calls(WEATHER)),
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_expected_reply(name: str) -> None:
    make, text, expected = CASES[name]
    events = run(make, [text])
    assert accumulate(events) == expected
    for tool_call in expected.tool_calls:  # the canonical serialisation round-trips
        arguments = tool_call["function"]["arguments"]
        assert json.dumps(json.loads(arguments), ensure_ascii=False) == arguments


@pytest.mark.parametrize("name", CASES)
def test_every_chunking_gives_the_same_events(name: str) -> None:
    make, text, _ = CASES[name]
    assert violations(make, text) == []


def test_naive_parser_fails_the_chunking_property() -> None:
    """Negative control: a parser that looks for a whole call within each chunk breaks on cut tags."""

    class NaiveHermes:
        CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)

        def __init__(self) -> None:
            self.index = 0

        def push(self, text: str) -> list[Event]:
            out: list[Event] = []
            pos = 0
            for match in self.CALL.finditer(text):
                out.append(Content(text[pos : match.start()]))
                body = json.loads(match[1])
                out += [
                    ToolCallStart(self.index, f"call_{self.index:024x}", body["name"]),
                    ToolCallArgs(self.index, json.dumps(body["arguments"], ensure_ascii=False)),
                ]
                self.index += 1
                pos = match.end()
            out.append(Content(text[pos:]))
            return [e for e in out if not isinstance(e, Content) or e.text]

        def finish(self) -> list[Event]:
            return []

    text = f"Let me check.\n<tool_call>\n{W}\n</tool_call>"
    naive = violations(lambda: OutputParser(None, NaiveHermes()), text)  # type: ignore[arg-type]
    assert naive, "the chunking check has no power"
    assert violations(HERMES, text) == []


# --- streaming behaviour --------------------------------------------------------------------------------

ALL_CONFIGS = {
    "hermes": HERMES,
    "think-hermes": THINK_HERMES,
    "llama": LLAMA,
    "mistral": MISTRAL,
    "plain": parser(None, tools=False),
}


@pytest.mark.parametrize("config", ALL_CONFIGS)
def test_text_without_tags_streams_unchanged(config: str) -> None:
    text = "Hello! Here is the answer: 42, with unicode é 🌍.\n"
    p = ALL_CONFIGS[config]()
    assert p.push(text) == [Content(text)]
    assert p.finish() == []


@pytest.mark.parametrize(
    ("config", "tail"), [("hermes", "<tool_ca"), ("mistral", "[TOOL_"), ("think-hermes", "<tool_call")]
)
def test_only_a_partial_tag_is_held_back(config: str, tail: str) -> None:
    p = ALL_CONFIGS[config]()
    assert p.push("Some text " + tail) == [Content("Some text ")]
    assert p.finish() == [Content(tail)]


def test_reasoning_streams_before_the_end_tag() -> None:
    p = THINK_HERMES()
    assert p.push("<think>\nFirst, ") == [Reasoning("First,")]  # the trailing space waits for what follows
    assert p.push("add.\n</thi") == [Reasoning(" add.")]
    assert p.push("nk>\n\nDone") == [Content("Done")]
    assert p.finish() == []


def test_content_before_a_call_streams_before_the_call_completes() -> None:
    p = HERMES()
    assert p.push('Checking.<tool_call>{"name": "get_wea') == [Content("Checking.")]
    assert p.push('ther", "arguments": {"city": "Paris"}}</tool_call>') == [
        ToolCallStart(0, "call_" + "0" * 24, "get_weather"),
        ToolCallArgs(0, '{"city": "Paris"}'),
    ]
    assert p.finish() == []


def test_merge_coalesces_only_neighbours_of_the_same_kind() -> None:
    events: list[Event] = [
        Reasoning("a"),
        Reasoning("b"),
        Content("c"),
        Content("d"),
        ToolCallStart(0, "x", "f"),
        ToolCallArgs(0, "{"),
        ToolCallArgs(0, "}"),
        ToolCallStart(1, "y", "g"),
        ToolCallArgs(1, "{}"),
        Content("e"),
    ]
    assert merge(events) == [
        Reasoning("ab"),
        Content("cd"),
        ToolCallStart(0, "x", "f"),
        ToolCallArgs(0, "{}"),
        ToolCallStart(1, "y", "g"),
        ToolCallArgs(1, "{}"),
        Content("e"),
    ]
