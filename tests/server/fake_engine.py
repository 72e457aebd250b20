"""A scripted engine implementing the `EngineClient` contract, for testing the HTTP layer.

Like the real worker it runs one request at a time in submission order (a background task per
request waits for the single slot), bounds the waiting queue, posts one `TokenEvent` per round and
exactly one terminal event, and frees a cancelled request at the next round boundary, also while
it is queued. It records submissions, encodings and cancels for the tests to inspect.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from engine.api import (
    ContextLengthExceeded,
    EngineDead,
    EngineError,
    EngineInfo,
    EngineInputError,
    EngineNotReady,
    EngineOverloaded,
    Failed,
    Finished,
    GenerationRequest,
    SpecStats,
    TokenEvent,
    Usage,
)

INFO = EngineInfo(model_id="fake-model", model_path="/models/fake", mode="dspark", drafter="fake-drafter", cap=4,
                  context_length=256, sampler="rejection")


@dataclass
class Script:
    """What the fake does for one request: rounds of text after delays, then the finish."""

    rounds: list[str] = field(default_factory=lambda: ["Hel", "lo", ", world"])
    reason: str = "stop"
    final_text: str = ""
    first_delay_s: float = 0.0  # prefill
    round_delay_s: float = 0.0
    fail_after: int | None = None  # raise an EngineError after this many rounds
    fail_with: EngineError = field(default_factory=lambda: EngineError("kernel exploded at /secret/path"))


def echo_script(request: GenerationRequest) -> Script:
    """The default: deterministic text that depends on the prompt and the seed."""
    digest = sum(request.prompt_ids) + (request.sampling.seed or 0)
    return Script(rounds=["Hel", "lo", f" #{digest}"])


@dataclass(eq=False)
class FakeHandle:
    """The request handle: queue position and the per-request event queue."""

    request: GenerationRequest
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    queue_position: int = 0
    task: asyncio.Task | None = None


class FakeEngine:
    """Scripted stand-in for `engine.client.EngineClient`."""

    def __init__(self, script: Callable[[GenerationRequest], Script] = echo_script, *, state: str = "ready",
                 info: EngineInfo = INFO, max_queue: int = 16, submit_error: EngineError | None = None,
                 template: str | None = None, encode_delay_s: float = 0.0, refuse_nul: bool = True) -> None:
        self.script = script
        self.template = template  # the chat template source `chat_template()` reports
        self.encode_delay_s = encode_delay_s  # a blocking sleep in every encode (a slow template or tokenizer)
        self.refuse_nul = refuse_nul  # encode_text raises EngineInputError on "\x00" (an input the engine refuses)
        self._state = state
        self._info = info
        self.max_queue = max_queue
        self.submit_error = submit_error
        self.dead_reason_text: str | None = "worker crashed: out of memory" if state == "dead" else None
        self.submitted: list[GenerationRequest] = []
        self.encoded: list[tuple[list[dict], dict | None]] = []
        self.cancelled: list[str] = []
        self.finished: list[str] = []
        self._waiting: list[FakeHandle] = []
        self._slot = asyncio.Lock()
        self.started = False
        self.shut_down = False

    # -- lifecycle and state --------------------------------------------------------------------
    def start(self) -> None:
        self.started = True

    @property
    def state(self) -> str:
        return self._state

    def set_state(self, state: str, reason: str | None = None) -> None:
        self._state, self.dead_reason_text = state, reason

    @property
    def dead_reason(self) -> str | None:
        return self.dead_reason_text

    def info(self) -> EngineInfo | None:
        return self._info if self._state == "ready" else None

    def queue_depth(self) -> int:
        return len(self._waiting)

    async def shutdown(self) -> None:
        self.shut_down = True

    # -- encoding -------------------------------------------------------------------------------
    def encode_chat(self, messages: list[dict], chat_template_kwargs: dict | None = None) -> list[int]:
        self.encoded.append((messages, chat_template_kwargs))
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return self.encode_text(text)

    def encode_text(self, text: str) -> list[int]:
        time.sleep(self.encode_delay_s)  # blocking on purpose: what a slow render does to its thread
        if self.refuse_nul and "\x00" in text:
            raise EngineInputError("prompt contains a NUL character", param="messages")
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode(errors="replace")

    def chat_template(self) -> str | None:
        return self.template

    # -- requests -------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> FakeHandle:
        if self._state == "loading":
            raise EngineNotReady("models are loading")
        if self._state == "dead":
            raise EngineDead(f"engine is dead: {self.dead_reason_text}")
        if self.submit_error is not None:
            raise self.submit_error
        self._validate_ids(request)
        if len(request.prompt_ids) + request.max_tokens > self._info.context_length:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {self._info.context_length} tokens; the prompt has "
                f"{len(request.prompt_ids)} and max_tokens is {request.max_tokens}.", param="max_tokens")
        if len(self._waiting) >= self.max_queue and self._slot.locked():
            raise EngineOverloaded(f"queue full ({self.max_queue} waiting)")
        self.submitted.append(request)
        handle = FakeHandle(request)
        self._waiting.append(handle)
        self._renumber()
        handle.task = asyncio.ensure_future(self._work(handle))
        return handle

    async def stream(self, handle: FakeHandle) -> AsyncIterator[TokenEvent | Finished]:
        try:
            while True:
                event = await handle.events.get()
                if isinstance(event, Failed):
                    raise event.error
                yield event
                if isinstance(event, Finished):
                    return
        except (asyncio.CancelledError, GeneratorExit):
            self.cancel(handle)
            raise

    def cancel(self, handle: FakeHandle) -> None:
        if handle.cancelled:
            return
        handle.cancelled = True
        self.cancelled.append(handle.request.request_id)
        if handle in self._waiting:
            self._waiting.remove(handle)
            self._renumber()

    def _validate_ids(self, request: GenerationRequest) -> None:
        """Token ids within the vocabulary, as `EngineClient._validate` checks them (when it is known)."""
        vocab = self._info.vocab_size
        if vocab and any(not 0 <= t < vocab for t in request.prompt_ids):
            raise EngineInputError(f"prompt token ids must be in [0, {vocab})", param="prompt")
        if vocab and any(not 0 <= t < vocab for t, _ in request.sampling.logit_bias):
            raise EngineInputError(f"logit_bias token ids must be in [0, {vocab})", param="logit_bias")

    # -- the "worker" ---------------------------------------------------------------------------
    def _renumber(self) -> None:
        base = 1 if self._slot.locked() else 0
        for i, waiting in enumerate(self._waiting):
            waiting.queue_position = base + i

    async def _work(self, handle: FakeHandle) -> None:
        async with self._slot:
            if handle.cancelled:
                return
            self._waiting.remove(handle)
            handle.queue_position = 0
            self._renumber()
            await self._run(handle, self.script(handle.request))

    async def _run(self, handle: FakeHandle, script: Script) -> None:
        request = handle.request
        await asyncio.sleep(script.first_delay_s)
        stats = SpecStats(mode=self._info.mode, cap=self._info.cap, accepted_by_position=[0] * 4,
                          verified_by_position=[0] * 4)
        generated = 0
        for i, text in enumerate(script.rounds[: request.max_tokens]):
            if handle.cancelled:
                return
            if script.fail_after is not None and i == script.fail_after:
                handle.events.put_nowait(Failed(script.fail_with))
                return
            if i:
                await asyncio.sleep(script.round_delay_s)
                if handle.cancelled:
                    return
            ids = list(range(100 + i, 100 + i + max(len(text) // 2, 1)))
            generated += len(ids)
            self._count_round(stats, len(ids))
            handle.events.put_nowait(TokenEvent(token_ids=ids, text=text))
        reason = script.reason if len(script.rounds) <= request.max_tokens else "length"
        stats.generated_tokens = stats.round_tokens = generated
        usage = Usage(prompt_tokens=len(request.prompt_ids), completion_tokens=generated)
        self.finished.append(request.request_id)
        handle.events.put_nowait(Finished(reason=reason, usage=usage, stats=stats, text=script.final_text))

    @staticmethod
    def _count_round(stats: SpecStats, committed: int) -> None:
        stats.rounds += 1
        stats.drafted_tokens += 4
        stats.accepted_tokens += committed - 1
        for pos in range(4):
            stats.verified_by_position[pos] += 1 if pos <= committed - 1 else 0
            stats.accepted_by_position[pos] += 1 if pos < committed - 1 else 0
