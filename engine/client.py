"""EngineClient: the asyncio bridge to the engine worker (the only asyncio-aware engine module).

`submit()` validates and enqueues on the event loop thread and raises client errors at once, so
the server can answer 4xx before any SSE frame. `stream()` yields the worker's events; a consumer
that stops early (disconnect, CancelledError, aclose) cancels the request in the worker.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from engine.api import (
    ContextLengthExceeded, EngineConfig, EngineDead, EngineInfo, EngineInputError, EngineNotReady, EngineOverloaded,
    Failed, Finished, GenerationRequest, TokenEvent,
)
from engine.worker import EngineWorker, Job

_ids = itertools.count()
MAX_LOGPROBS = 20  # OpenAI's limit on top alternatives per token


@dataclass(eq=False)
class RequestHandle:
    """A submitted request: its job and the asyncio queue its events arrive on."""

    request: GenerationRequest
    job: Job
    events: asyncio.Queue
    client: EngineClient = field(repr=False)

    @property
    def queue_position(self) -> int:
        """0 once running, n while n-th in the waiting queue."""
        return self.client._position(self)


class EngineClient:
    """Owns the worker thread; safe to call from one asyncio event loop."""

    def __init__(self, config: EngineConfig, runtime_factory=None):
        self.config = config
        self._worker = EngineWorker(config, runtime_factory)
        self._waiting: list[RequestHandle] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the worker thread (models load in it; `state` says when ready)."""
        self._worker.start()

    @property
    def state(self) -> str:
        """"loading", "ready" or "dead"."""
        if self._worker.state == "ready" and not self._worker.is_alive():
            return "dead"
        return self._worker.state

    @property
    def dead_reason(self) -> str | None:
        """Why the engine is dead, if it is."""
        return self._worker.dead_reason or (None if self.state != "dead" else "engine thread exited")

    def info(self) -> EngineInfo | None:
        """What is served; None while loading or after a failed load."""
        runtime = self._worker.runtime
        return runtime.info if runtime is not None else None

    async def shutdown(self) -> None:
        """Stop the worker after its current round and wait for it."""
        if self._worker.is_alive():
            self._worker.stop()
            await asyncio.to_thread(self._worker.join, 10.0)

    # ------------------------------------------------------------------ tokenization

    def _tokenizer(self):
        self._require_ready()
        return self._worker.runtime.tokenizer

    def encode_chat(self, messages: list[dict], chat_template_kwargs: dict | None = None) -> list[int]:
        """Prompt ids for OpenAI-style messages through the model's chat template."""
        from engine.text import apply_chat_template

        try:
            return apply_chat_template(self._tokenizer(), messages, **(chat_template_kwargs or {}))
        except (ValueError, TypeError, KeyError) as exc:
            raise EngineInputError(f"could not apply the chat template: {exc}", param="messages") from exc
        except Exception as exc:  # jinja2 TemplateError and friends: still the client's messages
            raise EngineInputError(f"chat template error: {exc}", param="messages") from exc

    def encode_text(self, text: str) -> list[int]:
        """Prompt ids for raw text (no template)."""
        try:
            return list(self._tokenizer().encode(text))
        except (ValueError, TypeError) as exc:
            raise EngineInputError(f"could not tokenize the prompt: {exc}", param="prompt") from exc

    def decode(self, ids: list[int]) -> str:
        """Text of token ids, special tokens included (for reading a rendered prompt's end)."""
        return self._tokenizer().decode(list(ids), skip_special_tokens=False)

    def chat_template(self) -> str | None:
        """The chat template's source text (None if the tokenizer has none), to choose output parsers."""
        template = getattr(self._tokenizer(), "chat_template", None)
        if isinstance(template, dict):  # several named templates: the default one is used
            template = template.get("default") or next(iter(template.values()), None)
        return template if isinstance(template, str) else None

    # ------------------------------------------------------------------ requests

    def queue_depth(self) -> int:
        """Requests waiting behind the running one."""
        with self._lock:
            self._waiting = [h for h in self._waiting if not (h.job.started.is_set() or h.job.cancelled.is_set())]
            return len(self._waiting)

    def _position(self, handle: RequestHandle) -> int:
        with self._lock:
            live = [h for h in self._waiting if not (h.job.started.is_set() or h.job.cancelled.is_set())]
        return live.index(handle) + 1 if handle in live else 0

    def _require_ready(self) -> None:
        state = self.state
        if state == "loading":
            raise EngineNotReady("the model is still loading")
        if state == "dead":
            raise EngineDead(self.dead_reason or "the engine is not running")

    def _validate(self, request: GenerationRequest) -> None:
        if not request.prompt_ids:
            raise EngineInputError("the prompt is empty", param="messages")
        vocab = self.info().vocab_size
        if vocab and any(not 0 <= t < vocab for t in request.prompt_ids):
            raise EngineInputError(f"prompt token ids must be in [0, {vocab})", param="prompt")
        if request.max_tokens < 1:
            raise EngineInputError("max_tokens must be at least 1", param="max_tokens")
        self._validate_processing(request, vocab)
        limit = self.info().context_length
        if len(request.prompt_ids) + request.max_tokens > limit:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(request.prompt_ids) + request.max_tokens} tokens ({len(request.prompt_ids)} in the "
                f"messages, {request.max_tokens} in the completion).", param="messages")

    @staticmethod
    def _validate_processing(request: GenerationRequest, vocab: int) -> None:
        """Logit bias ids in the vocabulary, a positive repetition penalty, logprobs in 0..20."""
        s = request.sampling
        if vocab and any(not 0 <= int(t) < vocab for t, _ in s.logit_bias):
            raise EngineInputError(f"logit_bias token ids must be in [0, {vocab})", param="logit_bias")
        if not s.repetition_penalty > 0:
            raise EngineInputError("repetition_penalty must be greater than 0", param="repetition_penalty")
        if request.logprobs is not None and not 0 <= request.logprobs <= MAX_LOGPROBS:
            raise EngineInputError(f"logprobs must be between 0 and {MAX_LOGPROBS}", param="logprobs")

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Validate and enqueue; raises EngineError subclasses synchronously."""
        self._require_ready()
        self._validate(request)
        if self.queue_depth() >= self.config.max_queue:
            raise EngineOverloaded(f"{self.config.max_queue} requests are already waiting")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def sink(event) -> None:  # called on the worker thread
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:
                pass  # the loop closed: nobody is listening any more

        handle = RequestHandle(request, Job(request, sink), events, self)
        with self._lock:
            self._waiting.append(handle)
        self._worker.submit(handle.job)
        return handle

    async def stream(self, handle: RequestHandle) -> AsyncIterator[TokenEvent | Finished]:
        """Yield TokenEvents then one Finished; raise the EngineError of a Failed."""
        try:
            while True:
                event = await handle.events.get()
                if isinstance(event, Failed):
                    raise event.error
                yield event
                if isinstance(event, Finished):
                    return
        except BaseException:
            self.cancel(handle)  # CancelledError / GeneratorExit / errors: free the worker
            raise

    def cancel(self, handle: RequestHandle) -> None:
        """Idempotent: the worker drops it if queued, or stops it at the next round boundary."""
        handle.job.cancelled.set()
