"""Protocol <-> engine: requests to `GenerationRequest`, engine events to OpenAI objects.

A formatter builds the OpenAI objects of one request: `opening()` before any token, `delta(text)`
per engine round, `closing(finished)` at the end of a stream, `response(text, finished)` for a
non-streaming reply. Chat and text completions differ only here.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from engine.api import Finished, GenerationRequest, SamplingParams
from server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChunkDelta,
    CompletionChoice,
    CompletionResponse,
    GenerationFields,
    Usage,
)

DEFAULT_TEMPERATURE = 1.0  # OpenAI's default when the request omits it
_TEMPLATE_ROLES = {"developer": "system"}  # chat templates rarely know "developer"


def new_id(prefix: str) -> str:
    """A fresh response id, `chatcmpl-...` / `cmpl-...`."""
    return f"{prefix}-{uuid.uuid4().hex}"


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """OpenAI messages as the plain dicts `EngineClient.encode_chat` takes (string content)."""
    out = []
    for message in req.messages:
        item: dict[str, Any] = {"role": _TEMPLATE_ROLES.get(message.role, message.role), "content": message.text()}
        if message.name is not None:
            item["name"] = message.name
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


def sampling_params(req: GenerationFields) -> SamplingParams:
    """The request's sampling fields; `top_k: -1` (vLLM's "off") is 0 for the engine."""
    return SamplingParams(
        temperature=DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=max(req.top_k or 0, 0),
        min_p=req.min_p or 0.0,
        seed=req.seed,
        sampler=req.dspark.sampler if req.dspark else None,
    )


def generation_request(
    request_id: str, req: GenerationFields, prompt_ids: list[int], max_tokens: int | None, context_length: int
) -> GenerationRequest:
    """The engine request; without `max_tokens` the rest of the context window is the limit."""
    if max_tokens is None:
        max_tokens = max(context_length - len(prompt_ids), 1)  # an over-long prompt fails in submit()
    return GenerationRequest(
        request_id=request_id,
        prompt_ids=tuple(prompt_ids),
        max_tokens=max_tokens,
        sampling=sampling_params(req),
        stop=tuple(req.stop or ()),
    )


def usage(finished: Finished) -> Usage:
    """OpenAI usage from the engine's counts."""
    u = finished.usage
    return Usage(prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                 total_tokens=u.prompt_tokens + u.completion_tokens)


class ChatFormatter:
    """Chat completion objects for one request."""

    def __init__(self, request_id: str, model: str, include_usage: bool) -> None:
        self.id, self.model, self.include_usage = request_id, model, include_usage
        self.created = int(time.time())

    def _chunk(self, choices: list[ChatChunkChoice], **extra: Any) -> dict[str, Any]:
        chunk = ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices, **extra)
        exclude = set() if self.include_usage else {"usage"}
        if chunk.dspark_stats is None:
            exclude.add("dspark_stats")
        out = chunk.model_dump(mode="json", exclude=exclude)
        for choice in out["choices"]:  # OpenAI sends {"content": "..."}, not {"role": null, ...}
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
        return out

    def opening(self) -> list[dict[str, Any]]:
        """The role chunk."""
        return [self._chunk([ChatChunkChoice(delta=ChunkDelta(role="assistant", content=""))])]

    def delta(self, text: str) -> dict[str, Any]:
        """A content chunk."""
        return self._chunk([ChatChunkChoice(delta=ChunkDelta(content=text))])

    def closing(self, finished: Finished) -> list[dict[str, Any]]:
        """Trailing text, the finish chunk (with `dspark_stats`), then the usage chunk if asked."""
        chunks = [self.delta(finished.text)] if finished.text else []
        finish = ChatChunkChoice(delta=ChunkDelta(), finish_reason=finished.reason)
        chunks.append(self._chunk([finish], dspark_stats=finished.stats.as_dict()))
        if self.include_usage:
            chunks.append(self._chunk([], usage=usage(finished)))
        return chunks

    def response(self, text: str, finished: Finished) -> dict[str, Any]:
        """The non-streaming reply."""
        choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=finished.reason)
        reply = ChatCompletionResponse(id=self.id, created=self.created, model=self.model, choices=[choice],
                                       usage=usage(finished), dspark_stats=finished.stats.as_dict())
        return reply.model_dump(mode="json")


class CompletionFormatter:
    """Text completion objects for one request (no role chunk in this API)."""

    def __init__(self, request_id: str, model: str, include_usage: bool) -> None:
        self.id, self.model, self.include_usage = request_id, model, include_usage
        self.created = int(time.time())

    def _object(self, choices: list[CompletionChoice], **extra: Any) -> dict[str, Any]:
        obj = CompletionResponse(id=self.id, created=self.created, model=self.model, choices=choices, **extra)
        exclude = set() if self.include_usage or obj.usage is not None else {"usage"}
        if obj.dspark_stats is None:
            exclude.add("dspark_stats")
        return obj.model_dump(mode="json", exclude=exclude)

    def opening(self) -> list[dict[str, Any]]:
        """Nothing: text completion streams start with the first text."""
        return []

    def delta(self, text: str) -> dict[str, Any]:
        """A text chunk."""
        return self._object([CompletionChoice(text=text)])

    def closing(self, finished: Finished) -> list[dict[str, Any]]:
        """The finish chunk (with any trailing text and `dspark_stats`), then usage if asked."""
        finish = CompletionChoice(text=finished.text, finish_reason=finished.reason)
        chunks = [self._object([finish], dspark_stats=finished.stats.as_dict())]
        if self.include_usage:
            chunks.append(self._object([], usage=usage(finished)))
        return chunks

    def response(self, text: str, finished: Finished) -> dict[str, Any]:
        """The non-streaming reply."""
        choice = CompletionChoice(text=text, finish_reason=finished.reason)
        return self._object([choice], usage=usage(finished), dspark_stats=finished.stats.as_dict())
