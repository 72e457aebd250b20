"""A scripted engine implementing the `EngineClient` contract, for testing the HTTP layer.

Like the real worker it runs one request at a time in submission order (a background task per
request waits for the single slot), bounds the waiting queue, posts one `TokenEvent` per round and
exactly one terminal event, and frees a cancelled request at the next round boundary, also while
it is queued. Admission checks and reading a request's queue are the real client's functions. It
records submissions, encodings and cancels for the tests to inspect.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.api import (
    EngineError,
    EngineInfo,
    EngineInputError,
    Failed,
    Finished,
    GenerationRequest,
    SpecStats,
    TokenEvent,
    Usage,
)
from engine.client import require_queue_room, require_ready, take_event, validate_request

HANG_GUARD_S = 60.0  # a closed gate past this is a test bug, not a slow machine

IMAGE_TOKEN_ID = 0xFF  # the fake's image placeholder: a byte never found in UTF-8 text
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


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


@dataclass(eq=False)
class FakeHandle:
    """The request handle: queue position and the per-request queue of events and interrupts."""

    request: GenerationRequest
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    finished: bool = False
    queue_position: int = 0
    task: asyncio.Task | None = None


class FakeEngine:
    """Scripted stand-in for `engine.client.EngineClient`."""

    def __init__(self, script: Callable[[GenerationRequest], Script] = echo_script, *, state: str = "ready",
                 info: EngineInfo = INFO, max_queue: int = 16, submit_error: EngineError | None = None,
                 template: str | None = None, encode_gate: threading.Event | None = None,
                 refuse_nul: bool = True) -> None:
        self.script = script
        self.template = template  # the chat template source `chat_template()` reports
        # Every encode blocks its thread until the gate opens (a slow template or tokenizer, ended by
        # the test rather than by a clock); `encode_started` is set when one begins.
        self.encode_gate = encode_gate
        self.encode_started = threading.Event()
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
        self._state_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._state_lock = threading.Lock()  # set_state may come from another thread

    # -- lifecycle and state --------------------------------------------------------------------
    def start(self) -> None:
        self.started = True

    @property
    def state(self) -> str:
        return self._state

    def set_state(self, state: str, reason: str | None = None) -> None:
        """Change state (from any thread), waking `wait_ready` once loading ends."""
        with self._state_lock:
            self._state, self.dead_reason_text = state, reason
            if state == "loading":
                return
            waiters, self._state_waiters = self._state_waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_wake, future)

    async def wait_ready(self) -> str:
        """Wait until the state is no longer "loading"; return it."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._state_lock:
            if self._state != "loading":
                return self._state
            self._state_waiters.append((loop, future))
        await future
        return self._state

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
        """`<role>content` per message; content given as parts (with images) renders its text parts, and
        IMAGE_TOKEN_ID for each `{"type": "image"}` part, as a multimodal template does."""
        self.encoded.append((messages, chat_template_kwargs))
        ids: list[int] = []
        text = ""
        for m in messages:
            text += f"<{m['role']}>"
            if isinstance(m["content"], str):
                text += m["content"]
                continue
            for part in m["content"]:
                if part["type"] == "image":
                    ids += self.encode_text(text) + [IMAGE_TOKEN_ID]
                    text = ""
                else:
                    text += part["text"]
        return ids + self.encode_text(text + "<assistant>")

    def encode_text(self, text: str) -> list[int]:
        if self.encode_gate is not None:
            self.encode_started.set()
            assert self.encode_gate.wait(HANG_GUARD_S), "the test never opened the encode gate"
        if self.refuse_nul and "\x00" in text:
            raise EngineInputError("prompt contains a NUL character", param="messages")
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode(errors="replace")

    def chat_template(self) -> str | None:
        return self.template

    # -- requests -------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> FakeHandle:
        require_ready(self._state, self.dead_reason_text)
        if self.submit_error is not None:
            raise self.submit_error
        validate_request(request, self._info)
        # Only requests behind a running one wait: with the slot free the first of them starts now.
        require_queue_room(len(self._waiting) if self._slot.locked() else 0, self.max_queue)
        self.submitted.append(request)
        handle = FakeHandle(request)
        self._waiting.append(handle)
        self._renumber()
        handle.task = asyncio.ensure_future(self._work(handle))
        return handle

    async def next_event(self, handle: FakeHandle, timeout: float | None = None) -> TokenEvent | Finished | None:
        """As `EngineClient.next_event`: whatever is raised cancels the request."""
        try:
            event = await take_event(handle.events, timeout)
        except BaseException:
            self.cancel(handle)
            raise
        if isinstance(event, Finished):
            handle.finished = True
        return event

    def interrupt(self, handle: FakeHandle, exc: BaseException) -> None:
        """Deliver `exc` through the request's queue (event loop thread only)."""
        handle.events.put_nowait(exc)

    def cancel(self, handle: FakeHandle) -> None:
        if handle.cancelled:
            return
        handle.cancelled = True
        self.cancelled.append(handle.request.request_id)
        if handle in self._waiting:
            self._waiting.remove(handle)
            self._renumber()

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
            handle.events.put_nowait(TokenEvent(token_ids=ids, text=text, drafted=len(ids) - 1))  # as counted below
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
