"""Protocol <-> engine: requests to `GenerationRequest`, engine events to OpenAI objects.

A formatter builds the OpenAI objects of one request: `opening()` before any token,
`delta(event)` per engine round (zero or more chunks), `closing(finished)` at the end of a stream,
`response(events, finished)` for a non-streaming reply. A chat reply's text goes through the
request's output parser (reasoning, tool calls), which gives the same message however the text was
split into rounds, so a streamed reply accumulates to the non-streamed one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from engine.api import (
    Finished, GenerationRequest, GrammarSpec, ImageInput, SamplingParams, TokenEvent, TokenLogprob,
)
from server import logprobs as lp
from server import sse
from server.errors import APIError
from server.origins import TokenOrigins
from server.outputs.events import Content, Reasoning, ToolCallArgs, ToolCallStart
from server.outputs.pipeline import accumulate, make_parser, merge
from server.prompt import OutputSpec
from server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChunkDelta,
    CompletionChoice,
    CompletionResponse,
    GenerationFields,
    Usage,
)

DEFAULT_TEMPERATURE = 1.0  # OpenAI's default when the request omits it


def new_id(prefix: str) -> str:
    """A fresh response id, `chatcmpl-...` / `cmpl-...`."""
    return f"{prefix}-{uuid.uuid4().hex}"


def sampling_params(req: GenerationFields) -> SamplingParams:
    """The request's sampling fields; `top_k: -1` (vLLM's "off") is 0 for the engine."""
    return SamplingParams(
        temperature=DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=max(req.top_k or 0, 0),
        min_p=req.min_p or 0.0,
        seed=req.seed,
        sampler=req.dspark.sampler if req.dspark else None,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias=tuple(sorted(req.bias_by_id.items())),
    )


def generation_request(
    request_id: str, req: GenerationFields, prompt_ids: list[int], max_tokens: int | None, context_length: int,
    logprobs: int | None = None, grammar: GrammarSpec | None = None, images: tuple[ImageInput, ...] = (),
) -> GenerationRequest:
    """The engine request; without `max_tokens` the rest of the context window is the limit. `images`: in
    prompt order (server.vision.load_images)."""
    if max_tokens is None:
        max_tokens = max(context_length - len(prompt_ids), 1)  # an over-long prompt fails in submit()
    return GenerationRequest(
        request_id=request_id,
        prompt_ids=tuple(prompt_ids),
        max_tokens=max_tokens,
        sampling=sampling_params(req),
        stop=tuple(req.stop or ()),
        logprobs=logprobs,
        grammar=grammar,
        images=images,
        baseline=bool(req.dspark and req.dspark.baseline),
    )


def token_origins(req: GenerationFields, decode: Callable[[list[int]], str]) -> TokenOrigins | None:
    """The request's `dspark.token_origins` collector, or None when it is off (the default: no cost)."""
    return TokenOrigins(decode) if req.dspark and req.dspark.token_origins else None


def usage(finished: Finished, reasoning_tokens: int | None = None) -> Usage:
    """OpenAI usage from the engine's counts; cached_tokens: prompt tokens restored from the prefix cache."""
    u = finished.usage
    details = None if reasoning_tokens is None else {"reasoning_tokens": reasoning_tokens}
    return Usage(prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                 total_tokens=u.prompt_tokens + u.completion_tokens, prompt_tokens_details={"cached_tokens": u.cached_tokens},
                 completion_tokens_details=details)


class ChatFormatter:
    """Chat completion objects for one request."""

    framing = sse.DATA_ONLY

    @staticmethod
    def error_body(error: APIError) -> dict[str, Any]:
        """An error after the stream started: OpenAI's error object."""
        return error.body()

    def __init__(self, request_id: str, model: str, include_usage: bool, spec: OutputSpec,
                 logprobs: bool = False, origins: TokenOrigins | None = None) -> None:
        self.id, self.model, self.include_usage = request_id, model, include_usage
        self.created = int(time.time())
        self._spec, self._logprobs, self._origins = spec, logprobs, origins
        self._parser = _parser(spec)
        self._pending: list[TokenLogprob] = []  # logprobs of text the parser still holds back
        self._token_ids: list[int] = []
        self._kinds: set[type] = set()  # the kinds of output events seen, for the reasoning count
        self._before_answer = 0  # tokens of the rounds before any answer text or call appeared

    # ------------------------------------------------------------------ chunks

    def _chunk(self, choices: list[ChatChunkChoice], **extra: Any) -> dict[str, Any]:
        chunk = ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices, **extra)
        exclude = set() if self.include_usage else {"usage"}
        exclude |= _unset_extensions(chunk)
        out = chunk.model_dump(mode="json", exclude=exclude)
        for choice in out["choices"]:  # OpenAI sends {"content": "..."}, not {"role": null, ...}
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
        return out

    def opening(self) -> list[dict[str, Any]]:
        """The role chunk."""
        return [self._chunk([ChatChunkChoice(delta=ChunkDelta(role="assistant", content=""))])]

    def delta(self, event: TokenEvent) -> list[dict[str, Any]]:
        """The chunks of one engine round (none while the parser holds the text back)."""
        self._pending += event.logprobs or []
        if self._origins is not None:
            self._origins.add(event)
        return self._chunks(self._push(event))

    def _chunks(self, events: list[Any]) -> list[dict[str, Any]]:
        out = []
        for ev in merge(events):
            choice = ChatChunkChoice(delta=self._delta_of(ev))
            if self._logprobs and self._pending:
                choice.logprobs = lp.chat_logprobs(self._pending)
                self._pending = []
            out.append(self._chunk([choice], dspark_tokens=_take(self._origins)))
        return out

    def _delta_of(self, ev: Any) -> ChunkDelta:
        if isinstance(ev, Content):
            return ChunkDelta(content=ev.text)
        if isinstance(ev, Reasoning):
            return ChunkDelta(reasoning_content=ev.text)
        if isinstance(ev, ToolCallStart):
            call = {"index": ev.index, "id": ev.id, "type": "function",
                    "function": {"name": ev.name, "arguments": ""}}
            return ChunkDelta(tool_calls=[call])
        assert isinstance(ev, ToolCallArgs), ev
        return ChunkDelta(tool_calls=[{"index": ev.index, "function": {"arguments": ev.text}}])

    def closing(self, finished: Finished) -> list[dict[str, Any]]:
        """Held-back text, the finish chunk (with `dspark_stats`), then the usage chunk if asked."""
        chunks = self._chunks(self._tail(finished))
        finish = ChatChunkChoice(delta=ChunkDelta(), finish_reason=self._reason(finished))
        if self._logprobs and self._pending:
            finish.logprobs = lp.chat_logprobs(self._pending)
        chunks.append(self._chunk([finish], dspark_stats=finished.stats.as_dict(), dspark_tokens=_take(self._origins)))
        if self.include_usage:
            chunks.append(self._chunk([], usage=self._usage(finished)))
        return chunks

    # ------------------------------------------------------------------ non-streaming

    def response(self, events: list[TokenEvent], finished: Finished) -> dict[str, Any]:
        """The non-streaming reply."""
        out: list[Any] = []
        for event in events:
            out += self._push(event)
        message = accumulate(merge(out + self._tail(finished)))
        calls = message.tool_calls or None
        reply_message = AssistantMessage(content=message.content if message.content or not calls else None,
                                         reasoning_content=message.reasoning, tool_calls=calls)
        if reply_message.content is None and not calls:
            reply_message.content = ""
        items = [item for event in events for item in event.logprobs or []]
        choice = ChatChoice(message=reply_message, finish_reason=self._reason(finished),
                            logprobs=lp.chat_logprobs(items) if self._logprobs else None)
        reply = ChatCompletionResponse(id=self.id, created=self.created, model=self.model, choices=[choice],
                                       usage=self._usage(finished),
                                       dspark_stats=finished.stats.as_dict(), dspark_tokens=_all(self._origins, events))
        body = reply.model_dump(mode="json", exclude=_unset_extensions(reply))
        body["choices"][0]["message"] = _without_none(body["choices"][0]["message"], "reasoning_content", "tool_calls")
        return body

    # ------------------------------------------------------------------ shared

    def _reason(self, finished: Finished) -> str:
        """`tool_calls` when the model stopped after calling tools, else the engine's reason."""
        return "tool_calls" if ToolCallStart in self._kinds and finished.reason == "stop" else finished.reason

    def _tail(self, finished: Finished) -> list[Any]:
        """The text released at the end, and whatever the parser still held back."""
        return self._parse(finished.text) + self._noted(self._parser.finish())

    def _push(self, event: TokenEvent) -> list[Any]:
        """Parse one round's text, keeping the token counts the reasoning count needs."""
        self._token_ids += event.token_ids
        answered = bool(self._kinds - {Reasoning})
        out = self._parse(event.text)
        if not answered and all(isinstance(ev, Reasoning) for ev in out):
            self._before_answer += len(event.token_ids)
        return out

    def _parse(self, text: str) -> list[Any]:
        return self._noted(self._parser.push(text) if text else [])

    def _noted(self, events: list[Any]) -> list[Any]:
        """`events`, with their kinds added to the kinds seen (the finish reason and reasoning count read them)."""
        self._kinds.update(type(ev) for ev in events)
        return events

    def _usage(self, finished: Finished) -> Usage:
        return usage(finished, self._reasoning_tokens() if self._spec.thinking else None)

    def _reasoning_tokens(self) -> int:
        """Generated tokens up to and including `</think>` (exact when it is one token; else the rounds
        before the answer began, which is exact to the round)."""
        end = self._spec.think_end_id
        if end is not None and end in self._token_ids:
            return self._token_ids.index(end) + 1
        return self._before_answer if Reasoning in self._kinds else 0


def _parser(spec: OutputSpec):
    return make_parser(spec.chat_template, spec.tools_requested, spec.thinking, spec.max_calls,
                       spec.prompt_ends_in_think)


def _without_none(obj: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if not (k in keys and v is None)}


def _unset_extensions(obj: Any) -> set[str]:
    """The `dspark_*` fields an object leaves out because they are unset (off, or not on this chunk)."""
    return {name for name in ("dspark_stats", "dspark_tokens") if getattr(obj, name) is None}


def _take(origins: TokenOrigins | None) -> list[Any] | None:
    """The token origins for the chunk being built: None when off or when no token waits."""
    return (origins.take() or None) if origins is not None else None


def _all(origins: TokenOrigins | None, events: list[TokenEvent]) -> list[Any] | None:
    """Every token's origin for a non-streamed reply (None when off)."""
    if origins is None:
        return None
    for event in events:
        origins.add(event)
    return origins.take()


class CompletionFormatter:
    """Text completion objects for one request (no role chunk in this API)."""

    framing = sse.DATA_ONLY

    @staticmethod
    def error_body(error: APIError) -> dict[str, Any]:
        """An error after the stream started: OpenAI's error object."""
        return error.body()

    def __init__(self, request_id: str, model: str, include_usage: bool, logprobs: bool = False,
                 origins: TokenOrigins | None = None) -> None:
        self.id, self.model, self.include_usage = request_id, model, include_usage
        self.created = int(time.time())
        self._logprobs, self._origins = logprobs, origins
        self._offset = 0  # text length so far, for `text_offset`

    def _object(self, choices: list[CompletionChoice], **extra: Any) -> dict[str, Any]:
        obj = CompletionResponse(id=self.id, created=self.created, model=self.model, choices=choices, **extra)
        exclude = set() if self.include_usage or obj.usage is not None else {"usage"}
        exclude |= _unset_extensions(obj)
        return obj.model_dump(mode="json", exclude=exclude)

    def _choice(self, text: str, items: list[TokenLogprob], reason: str | None = None) -> CompletionChoice:
        logprobs = lp.completion_logprobs(items, self._offset) if self._logprobs else None
        self._offset += len(text)
        return CompletionChoice(text=text, logprobs=logprobs, finish_reason=reason)

    def opening(self) -> list[dict[str, Any]]:
        """Nothing: text completion streams start with the first text."""
        return []

    def delta(self, event: TokenEvent) -> list[dict[str, Any]]:
        """A text chunk (none for a round whose text is held back and carries no logprobs)."""
        if self._origins is not None:
            self._origins.add(event)
        if not event.text and not (self._logprobs and event.logprobs):
            return []
        return [self._object([self._choice(event.text, event.logprobs or [])], dspark_tokens=_take(self._origins))]

    def closing(self, finished: Finished) -> list[dict[str, Any]]:
        """The finish chunk (with any trailing text and `dspark_stats`), then usage if asked."""
        finish = self._choice(finished.text, [], finished.reason)
        chunks = [self._object([finish], dspark_stats=finished.stats.as_dict(), dspark_tokens=_take(self._origins))]
        if self.include_usage:
            chunks.append(self._object([], usage=usage(finished)))
        return chunks

    def response(self, events: list[TokenEvent], finished: Finished) -> dict[str, Any]:
        """The non-streaming reply."""
        text = "".join(e.text for e in events) + finished.text
        items = [item for e in events for item in e.logprobs or []]
        choice = self._choice(text, items, finished.reason)
        return self._object([choice], usage=usage(finished), dspark_stats=finished.stats.as_dict(),
                            dspark_tokens=_all(self._origins, events))
