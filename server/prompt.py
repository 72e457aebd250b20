"""Chat request -> prompt token ids, and how to read the model's output back.

Tools, tool calls in history and reasoning go through the model's own chat template when it knows
them. A template that never mentions `tools` (the default SmolLM2 one, plain ChatML) gets a
Hermes-style tool prompt in its system message instead, its history's tool calls written as
`<tool_call>` blocks and tool results as `<tool_response>` user turns, so any chat model can be
offered tools; its output is then read with the Hermes parser.

Templates belong to the model, not the client: `chat_template_kwargs` reaches the template only
through `TEMPLATE_FLAGS`, each value a JSON scalar, so no request can supply a template, tokenizer
arguments (`truncation`, `max_length`, `tokenize`, ...) or structures for Jinja to walk. Rendering and
tokenizing run in a worker thread (`render_chat`, `render_text`), bounded in time and in size, so
that one request cannot stall the event loop that serves `/health` and every other stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from engine.api import ContextLengthExceeded
from server.errors import APIError
from server.outputs.formats import hermes_tool_system_prompt
from server.runtime import EngineLike

if TYPE_CHECKING:  # protocol imports TEMPLATE_FLAGS from here
    from server.protocol import ChatCompletionRequest, ChatMessage

T = TypeVar("T")

_TEMPLATE_ROLES = {"developer": "system", "function": "tool"}  # templates rarely know these
THINK_START, THINK_END = "<think>", "</think>"

# The `chat_template_kwargs` keys a chat template may receive: the switches that the chat templates
# of the model families we serve read. Anything else is ignored and reported (400 under
# --strict-params); `add_generation_prompt` is not here because a chat completion is always the
# assistant's next turn (raw continuations are what /v1/completions is for).
TEMPLATE_FLAGS: tuple[str, ...] = (
    "enable_thinking",  # Qwen3, Gemma 4, GLM-4.5, SmolLM3, Hunyuan; DeepSeek-V3.1 falls back to it
    "thinking",  # DeepSeek-V3.1, IBM Granite 3.x
    "reasoning_effort",  # gpt-oss (also set from the top-level `reasoning_effort`)
    "thinking_budget",  # ByteDance Seed-OSS
    "tools_in_user_message",  # Llama 3.1-3.3: tools in the first user turn (default) or the system turn
    "date_string",  # Llama 3.1-3.3: the "Today Date" line
)

# Longest time the chat template and the tokenizer may take for one request. A body within
# --max-body-bytes renders in well under a second; this bounds what slips past that.
RENDER_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class OutputSpec:
    """How the generated text of one request is split (see `server.outputs.pipeline.make_parser`)."""

    chat_template: str | None
    tools_requested: bool
    thinking: bool
    max_calls: int | None
    prompt_ends_in_think: bool
    think_end_id: int | None  # the `</think>` token, to count reasoning tokens exactly


async def render_chat(req: ChatCompletionRequest, engine: EngineLike,
                      context_length: int) -> tuple[list[int], OutputSpec]:
    """`build_chat_prompt` in a worker thread, bounded in time, with at most `context_length` ids."""
    return await _off_loop(build_chat_prompt, req, engine, context_length, param="messages")


async def render_text(prompt: str | list[int], engine: EngineLike, context_length: int) -> list[int]:
    """The ids of a completion prompt: token ids as given, text tokenized in a worker thread."""
    if not isinstance(prompt, str):
        return check_prompt_size(list(prompt), context_length, "prompt")
    ids = await _off_loop(engine.encode_text, prompt, param="prompt")
    return check_prompt_size(ids, context_length, "prompt")


async def _off_loop(fn: Callable[..., T], *args: Any, param: str) -> T:
    """`fn(*args)` in a worker thread; 400 `prompt_render_timeout` after RENDER_TIMEOUT_S.

    A render that times out keeps its thread until it finishes (threads cannot be killed), but the
    request is answered and the loop never waited on it.
    """
    try:
        return await asyncio.wait_for(asyncio.to_thread(fn, *args), RENDER_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise APIError(400, f"Rendering and tokenizing the prompt took longer than {RENDER_TIMEOUT_S:g} s; "
                            "send a shorter prompt.", param=param, code="prompt_render_timeout") from None


def check_prompt_size(ids: list[int], context_length: int, param: str) -> list[int]:
    """`ids`, unless empty (400 naming `param`) or longer than the context window.

    Checked where the ids are made, so a huge prompt is refused before the event loop copies or
    scans it (the engine's own check, with `max_tokens`, runs at submit).
    """
    if not ids:
        raise APIError(400, f"The '{param}' is empty: it must yield at least one token.", param=param,
                       code="invalid_value")
    if len(ids) > context_length:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context_length} tokens, and the prompt alone has "
            f"{len(ids)} tokens; shorten the {param}.", param=param)
    return ids


def build_chat_prompt(req: ChatCompletionRequest, engine: EngineLike,
                      context_length: int | None = None) -> tuple[list[int], OutputSpec]:
    """The prompt ids for a chat request and the spec of its output parser (blocking: see `render_chat`)."""
    template = engine.chat_template()
    native_tools = bool(template) and "tools" in template
    tools = [t.template_dict() for t in req.tool_defs]
    kwargs = template_kwargs(req)
    if tools and native_tools:
        kwargs["tools"] = tools
    native_calls = bool(template) and "tool_calls" in template
    messages = chat_messages(req.messages, native_calls, None if native_tools or not tools else tools)
    prompt_ids = engine.encode_chat(messages, kwargs)
    if context_length is not None:
        check_prompt_size(prompt_ids, context_length, "messages")
    thinking = bool(template) and THINK_START in template
    spec = OutputSpec(
        chat_template=template if native_tools else None,
        tools_requested=bool(tools),
        thinking=thinking,
        max_calls=req.max_tool_calls,
        prompt_ends_in_think=thinking and engine.decode(prompt_ids[-4:]).rstrip().endswith(THINK_START),
        think_end_id=_single_token(engine, THINK_END) if thinking else None,
    )
    return prompt_ids, spec


def template_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
    """Template variables: the allowed `chat_template_kwargs` (TEMPLATE_FLAGS; null means unset), plus
    `reasoning_effort` ("none" = no thinking). The only path from a request to the template's kwargs."""
    sent = req.chat_template_kwargs.model_dump(exclude_unset=True) if req.chat_template_kwargs else {}
    kwargs = {key: value for key, value in sent.items() if key in TEMPLATE_FLAGS and value is not None}
    effort = req.reasoning_effort
    if effort == "none":
        kwargs.setdefault("enable_thinking", False)
    elif effort is not None:
        kwargs.setdefault("reasoning_effort", effort)
    return kwargs


def chat_messages(messages: list[ChatMessage], native_calls: bool,
                  fallback_tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """OpenAI messages as the plain dicts a chat template takes.

    `native_calls`: the template renders `tool_calls` and `tool` turns itself; otherwise they are
    written as Hermes text. `fallback_tools`: tools to describe in the system message ourselves.
    """
    out = [_message_dict(m, native_calls) for m in messages]
    if fallback_tools:
        block = hermes_tool_system_prompt(fallback_tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def template_content(m: ChatMessage) -> str | list[dict[str, str]]:
    """A message's content as the chat template takes it.

    Text only (most messages): one string, the text parts joined by newlines. With images: the parts in
    order, as the multimodal chat templates of Hugging Face models read them: `{"type": "text", "text": ...}`
    and `{"type": "image"}` for each image. Such a template writes its image placeholder (Qwen2-VL's
    `<|image_pad|>`, Gemma 3's `<start_of_image>`, LLaVA's `<image>`) once per image part, so the
    rendered ids hold one `EngineInfo.image_token_id` per image, in the order of `server.vision.image_refs`;
    expanding it to the image's patch count is the engine's job.
    """
    if not m.has_images:
        return m.text()
    return [{"type": "image"} if part.type == "image_url" else {"type": "text", "text": part.text}
            for part in m.content]


def _message_dict(m: ChatMessage, native_calls: bool) -> dict[str, Any]:
    role = _TEMPLATE_ROLES.get(m.role, m.role)
    item: dict[str, Any] = {"role": role, "content": template_content(m)}
    if m.name is not None:
        item["name"] = m.name
    if m.reasoning_text is not None:
        item["reasoning_content"] = m.reasoning_text
    if native_calls:
        if m.tool_call_id is not None:
            item["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            item["tool_calls"] = [_call_dict(c) for c in m.tool_calls]
        return item
    if role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{m.text()}\n</tool_response>"}
    if m.tool_calls:
        calls = "\n".join(_hermes_call(c) for c in m.tool_calls)
        content = item["content"]
        if isinstance(content, list):  # parts with images: the calls are one more text part
            item["content"] = [*content, {"type": "text", "text": calls}]
        else:
            item["content"] = f"{content}\n{calls}" if content else calls
    return item


def _call_dict(call) -> dict[str, Any]:
    """A history tool call for a template: arguments as an object where they parse (templates expect one)."""
    out = {"type": "function", "function": {"name": call.function.name, "arguments": _arguments(call)}}
    if call.id is not None:
        out["id"] = call.id
    return out


def _hermes_call(call) -> str:
    body = {"name": call.function.name, "arguments": _arguments(call)}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"


def _arguments(call) -> Any:
    try:
        value = json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments
    return value if isinstance(value, dict) else call.function.arguments


def _single_token(engine: EngineLike, text: str) -> int | None:
    """The id of the one token that is `text` (a tokenizer may add a BOS id in front), else None."""
    ids = engine.encode_text(text)
    found = [i for i in ids if engine.decode([i]) == text]
    return found[0] if len(found) == 1 else None
