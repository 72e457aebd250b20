"""Which tool-call format a model speaks, read from its Jinja chat template, and the fallback prompt.

A template that renders tool calls shows their markup: Hermes-style templates (Qwen2.5/Qwen3, Hermes,
SmolLM3) write `<tool_call>`, Mistral's write `[TOOL_CALLS]`, Llama 3.1's write `<|python_tag|>`, and
Llama 3.2's write `"parameters"` beside the `ipython` role / `<|eom_id|>`. A template with none of these
gets None: the server then asks for Hermes-style calls with `hermes_tool_system_prompt`.
"""

from __future__ import annotations

import json
from typing import Any


def detect_format(chat_template: str | None) -> str | None:
    """`"hermes"`, `"mistral"`, `"llama3"` or None, from the chat template text."""
    if not chat_template:
        return None
    if "<tool_call>" in chat_template:
        return "hermes"
    if "[TOOL_CALLS]" in chat_template:
        return "mistral"
    if "<|python_tag|>" in chat_template:
        return "llama3"
    if '"parameters"' in chat_template and ("<|eom_id|>" in chat_template or "ipython" in chat_template):
        return "llama3"
    return None


def hermes_tool_system_prompt(tools: list[dict[str, Any]]) -> str:
    """A system-prompt block listing OpenAI `tools` and asking for `<tool_call>` answers (kept short for
    small models). Each tool is shown as its `function` object: name, description, parameters."""
    lines = [json.dumps(tool.get("function", tool), ensure_ascii=False) for tool in tools]
    return "\n".join(
        [
            "# Tools",
            "",
            "You can call these functions, listed inside <tools></tools>:",
            "<tools>",
            *lines,
            "</tools>",
            "",
            "To call a function, answer with one block per call, exactly like this:",
            "<tool_call>",
            '{"name": <function-name>, "arguments": <args-json-object>}',
            "</tool_call>",
            "Use only the functions above. If no function is needed, answer normally.",
        ]
    )
