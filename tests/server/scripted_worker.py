"""The real `EngineClient` and `EngineWorker` over a tiny MLX target whose forwards a test can hold.

The worker runs the real decoding loop (baseline mode, no drafter) on a 4-layer random llama, so
cancellation, queueing and event delivery are the production code paths; `GatedTarget` lets a test
stop the worker inside a chosen forward (a prefill or a decode round) with threading Events instead
of sleeps. Prompts are token id lists, so the tokenizer only has to decode.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from engine.api import (
    EngineCancelled, EngineConfig, EngineInfo, Failed, Finished, GenerationRequest, SamplingParams, SpecConfig,
)
from engine.client import EngineClient, RequestHandle
from engine.runtime import Runtime
from tests.engine import tiny

CONTEXT_LENGTH = 64
MODEL_ID = "tiny"


class GatedTarget:
    """Target proxy that counts forwards; forward number `hold_at` waits until `release` is set."""

    def __init__(self, target: Any) -> None:
        self.inner = target
        self.forwards = 0
        self.hold_at: int | None = None
        self.held = threading.Event()  # set when the worker is inside the held forward
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(self, ids: Any, cache: Any, taps: bool = True, inputs: Any = None) -> Any:
        """The inner forward, after waiting for `release` if this is the held one."""
        self.forwards += 1
        if self.forwards == self.hold_at:
            self.held.set()
            self.release.wait(30)  # a backstop only: every test releases it
        return self.inner.forward(ids, cache, taps=taps, inputs=inputs)


class WordTokenizer:
    """Decodes id i as " w<i>": every id is its own text, never held back."""

    chat_template = None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """The text of `ids`."""
        return "".join(f" w{i}" for i in ids)


class RecordingClient(EngineClient):
    """The real client; each submitted handle is also put on `handles` for the test to await."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handles: asyncio.Queue[RequestHandle] = asyncio.Queue()

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """`EngineClient.submit`, recorded."""
        handle = super().submit(request)
        self.handles.put_nowait(handle)
        return handle


def make_runtime(target: GatedTarget) -> Runtime:
    """An engine runtime serving `target` in baseline mode (no drafter)."""
    info = EngineInfo(model_id=MODEL_ID, model_path="-", mode="baseline", drafter=None, cap=None,
                      context_length=CONTEXT_LENGTH, sampler="rejection", vocab_size=tiny.VOCAB)
    return Runtime(target, None, WordTokenizer(), info, frozenset(), SpecConfig(mode="baseline"))


def make_client(target: GatedTarget, max_queue: int = 4) -> RecordingClient:
    """A client (not started) whose worker serves `target`."""
    runtime = make_runtime(target)
    return RecordingClient(EngineConfig(max_queue=max_queue), runtime_factory=lambda config: runtime)


def gated_target() -> GatedTarget:
    """A fresh tiny target behind a gate."""
    return GatedTarget(tiny.tiny_target())


def request(max_tokens: int = 4, request_id: str = "r") -> GenerationRequest:
    """A greedy engine request over a three-id prompt."""
    return GenerationRequest(request_id, (5, 6, 7), max_tokens, SamplingParams(temperature=0.0))


def completion_body(max_tokens: int = 4, stream: bool = False) -> dict[str, Any]:
    """A /v1/completions body with a token-id prompt (no tokenizer encode needed)."""
    return {"model": MODEL_ID, "prompt": [5, 6, 7], "max_tokens": max_tokens, "temperature": 0, "stream": stream}


def assert_stopped_by_cancel(handle: RequestHandle) -> None:
    """The worker ended the request with EngineCancelled, not a Finished.

    Call it once a later request has run, so the worker has posted its last word. What the consumer
    did not read stays in the request's queue: the events of its last round, then that Failed.
    """
    left: list[Any] = []
    while not handle.events.empty():
        left.append(handle.events.get_nowait())
    assert left and isinstance(left[-1], Failed) and isinstance(left[-1].error, EngineCancelled), left
    assert not any(isinstance(e, Finished) for e in left)
