"""EngineClient: the asyncio bridge to the engine worker (the only asyncio-aware engine module).

`submit()` validates and enqueues on the event loop thread and raises client errors at once, so
the server can answer 4xx before any SSE frame. Each request has one asyncio queue: the worker
posts its events there, and `interrupt()` puts an exception there (a disconnect, a drain deadline),
so `next_event()` is the only place a consumer waits. Leaving a request before its terminal event
(an error or interrupt raised, a cancelled task, a `stream()` closed early) cancels it in the worker.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from engine.api import (
    ContextLengthExceeded, EngineConfig, EngineDead, EngineInfo, EngineInputError, EngineNotReady, EngineOverloaded,
    Failed, Finished, GenerationRequest, TokenEvent,
)
from engine.grammar import compile_grammar
from engine.worker import EngineWorker, Job

_ids = itertools.count()
MAX_LOGPROBS = 20  # OpenAI's limit on top alternatives per token


@dataclass(eq=False)
class RequestHandle:
    """A submitted request: its job and the asyncio queue its events (and interrupts) arrive on."""

    request: GenerationRequest
    job: Job
    events: asyncio.Queue
    client: EngineClient = field(repr=False)
    loop: asyncio.AbstractEventLoop = field(repr=False)
    finished: bool = False  # its Finished was taken: nothing left to cancel

    @property
    def queue_position(self) -> int:
        """0 once running, n while n-th in the waiting queue."""
        return self.client._position(self)


def require_ready(state: str, dead_reason: str | None) -> None:
    """Raise EngineNotReady while loading and EngineDead once dead."""
    if state == "loading":
        raise EngineNotReady("the model is still loading")
    if state == "dead":
        raise EngineDead(dead_reason or "the engine is not running")


def validate_request(request: GenerationRequest, info: EngineInfo) -> None:
    """Raise the EngineInputError of a request the served model cannot take as given."""
    if not request.prompt_ids:
        raise EngineInputError("the prompt is empty", param="messages")
    vocab = info.vocab_size
    if vocab and any(not 0 <= t < vocab for t in request.prompt_ids):
        raise EngineInputError(f"prompt token ids must be in [0, {vocab})", param="prompt")
    if request.max_tokens < 1:
        raise EngineInputError("max_tokens must be at least 1", param="max_tokens")
    _validate_processing(request, vocab)
    _validate_images(request, info)
    limit, prompt = info.context_length, len(request.prompt_ids)
    if prompt + request.max_tokens > limit:
        # A prompt that fits leaves max_tokens as what overflowed; name the field the client can change.
        raise ContextLengthExceeded(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt + request.max_tokens} tokens ({prompt} in the messages, {request.max_tokens} in the "
            f"completion).", param="max_tokens" if prompt < limit else "messages")


def _validate_images(request: GenerationRequest, info: EngineInfo) -> None:
    """Images only for a target with a vision tower, one per image placeholder of the prompt."""
    if not request.images:
        return
    if not info.vision:
        raise EngineInputError(f"the model {info.model_id} does not take images; send text only, or serve a "
                               "vision model (an mlx-vlm model with a vision tower)", param="messages")
    slots = sum(1 for t in request.prompt_ids if t == info.image_token_id)
    if slots != len(request.images):
        raise EngineInputError(f"the prompt has {slots} image placeholders for {len(request.images)} images",
                               param="messages")


def _validate_processing(request: GenerationRequest, vocab: int) -> None:
    """Logit bias ids in the vocabulary, a positive repetition penalty, logprobs in 0..20, a grammar
    that compiles."""
    s = request.sampling
    if vocab and any(not 0 <= int(t) < vocab for t, _ in s.logit_bias):
        raise EngineInputError(f"logit_bias token ids must be in [0, {vocab})", param="logit_bias")
    if not s.repetition_penalty > 0:
        raise EngineInputError("repetition_penalty must be greater than 0", param="repetition_penalty")
    if request.logprobs is not None and not 0 <= request.logprobs <= MAX_LOGPROBS:
        raise EngineInputError(f"logprobs must be between 0 and {MAX_LOGPROBS}", param="logprobs")
    if request.grammar is not None:
        compile_grammar(request.grammar)  # cached: the worker reuses it


def require_queue_room(queue_depth: int, max_queue: int) -> None:
    """Raise EngineOverloaded when `max_queue` requests are already waiting."""
    if queue_depth >= max_queue:
        raise EngineOverloaded(f"{max_queue} requests are already waiting")


async def take_event(events: asyncio.Queue, timeout: float | None) -> TokenEvent | Finished | None:
    """The next item of a request's queue: an event, None after `timeout` seconds, or a raise.

    A Failed raises its EngineError and an interrupted exception is raised as it is. An item that
    is already there is returned even with a zero timeout.
    """
    try:
        item = events.get_nowait()
    except asyncio.QueueEmpty:
        if timeout is None:
            item = await events.get()
        else:
            try:
                # Queue.get leaves the item queued if it is cancelled, so a timeout never loses one.
                item = await asyncio.wait_for(events.get(), timeout)
            except asyncio.TimeoutError:
                return None
    if isinstance(item, Failed):
        raise item.error
    if isinstance(item, BaseException):
        raise item
    return item


class EngineClient:
    """Owns the worker thread; safe to call from one asyncio event loop.

    `on_state(state)` is called on the worker thread at each state change ("ready", "dead");
    `wait_ready()` is the asyncio way to wait for the first one.
    """

    def __init__(self, config: EngineConfig, runtime_factory=None, on_state: Callable[[str], None] | None = None):
        self.config = config
        self._on_state = on_state
        self._state_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._worker = EngineWorker(config, runtime_factory, self._state_changed)
        self._waiting: list[RequestHandle] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the worker thread (models load in it; `state` says when ready)."""
        self._worker.start()

    def _state_changed(self, state: str) -> None:
        """The worker's state callback (worker thread): wake the loops waiting in `wait_ready`."""
        if self._on_state is not None:
            self._on_state(state)
        with self._lock:
            waiters, self._state_waiters = self._state_waiters, []
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, future, state)
            except RuntimeError:
                pass  # that loop closed: nobody is waiting any more

    async def wait_ready(self) -> str:
        """Wait until loading ends; returns the state then reached, "ready" or "dead"."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        with self._lock:
            # The worker sets its state before calling back, and the callback takes this lock, so
            # a change is either seen here or wakes this future.
            if self._worker.state != "loading":
                return self.state
            self._state_waiters.append((loop, future))
        try:
            await future
        finally:
            with self._lock:
                if (loop, future) in self._state_waiters:
                    self._state_waiters.remove((loop, future))
        return self.state

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
        require_ready(self.state, self.dead_reason)

    def _validate(self, request: GenerationRequest) -> None:
        validate_request(request, self.info())

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Validate and enqueue; raises EngineError subclasses synchronously."""
        self._require_ready()
        self._validate(request)
        require_queue_room(self.queue_depth(), self.config.max_queue)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def sink(event) -> None:  # called on the worker thread
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:
                pass  # the loop closed: nobody is listening any more

        handle = RequestHandle(request, Job(request, sink), events, self, loop)
        with self._lock:
            self._waiting.append(handle)
        self._worker.submit(handle.job)
        return handle

    async def next_event(self, handle: RequestHandle, timeout: float | None = None) -> TokenEvent | Finished | None:
        """The request's next TokenEvent or its Finished; None if nothing came within `timeout` seconds.

        Raises the EngineError of a Failed, or the exception `interrupt()` delivered. Whatever is
        raised here (the waiting task's cancellation too) cancels the request in the worker.
        """
        try:
            event = await take_event(handle.events, timeout)
        except BaseException:
            self.cancel(handle)
            raise
        if isinstance(event, Finished):
            handle.finished = True
        return event

    def interrupt(self, handle: RequestHandle, exc: BaseException) -> None:
        """Make the request's next `next_event()` raise `exc` once the events before it are taken.

        Meant for the event loop thread; from another thread it is handed to the loop.
        """
        try:
            on_loop = asyncio.get_running_loop() is handle.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            handle.events.put_nowait(exc)
            return
        try:
            handle.loop.call_soon_threadsafe(handle.events.put_nowait, exc)
        except RuntimeError:
            pass  # the loop closed: nobody is listening any more

    async def stream(self, handle: RequestHandle) -> AsyncIterator[TokenEvent | Finished]:
        """Yield TokenEvents then one Finished; raise the EngineError of a Failed."""
        try:
            while not handle.finished:
                event = await self.next_event(handle)
                assert event is not None  # no timeout given
                yield event
        finally:
            if not handle.finished:
                self.cancel(handle)  # aclose / GeneratorExit: free the worker

    def cancel(self, handle: RequestHandle) -> None:
        """Idempotent: the worker drops it if queued, or stops it at the next round boundary."""
        handle.job.cancelled.set()


def _resolve(future: asyncio.Future, state: str) -> None:
    if not future.done():
        future.set_result(state)
