"""Structured output: the grammar a request's `response_format` or forced tool call asks for.

The engine enforces it exactly (engine/grammar.py); this module only says what the text must match:
- `response_format` `json_object`: any JSON object; `json_schema`: that schema, `strict` or not (we
  always enforce it, as vLLM does).
- `tool_choice` `"required"` or a named function (and the legacy `function_call` object): one call
  in the markup of the model's tool-call format (server/outputs/formats.py), its arguments matching
  the tool's `parameters`; several calls for `"required"` unless `parallel_tool_calls` is false. A
  forced call takes precedence over `response_format`.
- When the prompt already opened a `<think>` block, the grammar first closes it: a forced answer
  has no reasoning.
"""

from __future__ import annotations

import json
from typing import Any

from engine.api import GrammarSpec
from server.errors import APIError
from server.outputs.formats import detect_format
from server.prompt import OutputSpec
from server.protocol import ChatCompletionRequest, GenerationFields, ToolDef

# Markup around one call, per tool-call format (server/outputs/toolcalls.py parses the same), and the
# key its arguments sit under.
CALL_MARKUP = {"hermes": ('"<tool_call>\\n"', '"\\n</tool_call>"', "arguments"), "llama3": ("", "", "parameters")}
CALL_SEPARATOR = {"hermes": '"\\n"', "llama3": '";"'}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def format_grammar(req: GenerationFields) -> GrammarSpec | None:
    """The grammar of `response_format`, or None for free text."""
    fmt = req.response_format
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt["type"] == "json_object":
        return GrammarSpec("json_schema", json.dumps(ANY_OBJECT), param="response_format")
    schema = fmt["json_schema"].get("schema", ANY_OBJECT)
    schema = {} if schema is True else schema  # `true` is the schema every JSON value matches
    return GrammarSpec("json_schema", json.dumps(schema), param="response_format")


def chat_grammar(req: ChatCompletionRequest, spec: OutputSpec) -> GrammarSpec | None:
    """The grammar a chat request's output must match: a forced tool call, else its response_format."""
    forced = req.forced_tool_choice
    grammar = format_grammar(req) if forced is None else None
    if forced is None and (grammar is None or not spec.prompt_ends_in_think):
        return grammar
    # Lark, which can embed a JSON schema (`%json`), for a call's markup or to close an open <think>.
    if forced is not None:
        param, body, rules = _tool_call_rules(req, forced, spec)
    else:
        param, body, rules = grammar.param, f"%json {grammar.source}", ""
    head = '"</think>\\n\\n" ' if spec.prompt_ends_in_think else ""
    return GrammarSpec("lark", f"start: {head}{body}\n{rules}", param=param)


def _tool_call_rules(req: ChatCompletionRequest, forced: str, spec: OutputSpec) -> tuple[str, str, str]:
    """(param, start's body, rules) for one or more calls in the model's markup (one for a named
    function or `parallel_tool_calls: false`)."""
    param = req.forced_tool_field
    fmt = detect_format(spec.chat_template) or "hermes"
    if fmt not in CALL_MARKUP:
        raise APIError(400, f"Forcing a tool call is not served for this model's tool-call format ({fmt}); "
                            'use tool_choice "auto".', param=param, code="unsupported_parameter")
    tools = [t for t in req.tool_defs if forced == "required" or t.function.name == forced]
    opener, closer, args_key = CALL_MARKUP[fmt]
    schema = _call_schema(tools, args_key)
    call = " ".join(part for part in (opener, f"%json {json.dumps(schema)}", closer) if part)
    repeat = "" if forced != "required" or req.max_tool_calls == 1 else f" ({CALL_SEPARATOR[fmt]} call)*"
    return param, f"call{repeat}", f"call: {call}\n"


def _call_schema(tools: list[ToolDef], args_key: str) -> dict[str, Any]:
    """The JSON of one call to any of `tools`: {"name": <its name>, <args_key>: <its parameters>}."""
    variants = [
        {"type": "object",
         "properties": {"name": {"const": t.function.name}, args_key: t.function.parameters or ANY_OBJECT},
         "required": ["name", args_key], "additionalProperties": False}
        for t in tools
    ]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}
