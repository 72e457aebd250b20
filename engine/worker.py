"""The engine worker: the one thread that owns every MLX array, model and cache.

It loads the runtime, then takes requests from its inbox one at a time and runs them round by
round. After each round it posts one event to the request's sink and checks for cancellation, so a
cancelled request is freed within one round. Every request gets exactly one terminal event.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.api import (
    EngineCancelled, EngineConfig, EngineDead, EngineError, Event, Failed, Finished, GenerationRequest, SamplingParams,
    SpecStats, TokenEvent, TokenLogprob, Usage,
)
from engine.backend import blas_threads
from engine.processors import ProcessorSettings
from engine.sampling import SamplerSettings
from engine.spec import DecodeOptions, SpecDecoder
from engine.text import IncrementalDetokenizer, StopMatcher

log = logging.getLogger(__name__)


@dataclass
class Job:
    """A submitted request and where its events go (`sink` must be thread-safe)."""

    request: GenerationRequest
    sink: Callable[[Event], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)


class _Shutdown:
    pass


class EngineWorker(threading.Thread):
    """Loads the models, then serves jobs from `inbox` sequentially."""

    def __init__(self, config: EngineConfig, runtime_factory=None, on_state: Callable[[str], None] | None = None):
        super().__init__(name="dspark-engine", daemon=True)
        self.config = config
        self.inbox: queue.Queue = queue.Queue()
        self.runtime = None
        self.state = "loading"
        self.dead_reason: str | None = None
        self._factory = runtime_factory
        self._on_state = on_state or (lambda s: None)

    def submit(self, job: Job) -> None:
        """Queue a job (any thread)."""
        self.inbox.put(job)

    def stop(self) -> None:
        """Ask the worker to exit after the current round."""
        self.inbox.put(_Shutdown())

    def run(self) -> None:
        if not self._load():
            self._drain_dead()
            return
        while True:
            item = self.inbox.get()
            if isinstance(item, _Shutdown):
                break
            if item.cancelled.is_set():
                continue  # cancelled while queued: nobody is listening
            item.started.set()
            self._serve(item)
        self._set_state("dead", "shut down")
        self._drain_dead()

    def _load(self) -> bool:
        from engine.runtime import build_runtime

        try:
            # All MLX work happens on this thread, on the default stream. (A stream created here
            # with mx.new_stream made the process abort at exit about 1 run in 5.)
            self.runtime = (self._factory or build_runtime)(self.config)
        except Exception as exc:  # load failures make the engine dead, reported by /health
            log.error("engine failed to load: %s\n%s", exc, traceback.format_exc())
            self._set_state("dead", f"failed to load: {exc}")
            return False
        self._set_state("ready", None)
        return True

    def _set_state(self, state: str, reason: str | None) -> None:
        self.state, self.dead_reason = state, reason
        self._on_state(state)

    def _drain_dead(self) -> None:
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Job):
                item.sink(Failed(EngineDead(self.dead_reason or "engine is not running")))

    def _serve(self, job: Job) -> None:
        try:
            job.sink(run_request(self.runtime, job.request, job.cancelled, emit=job.sink))
        except Exception as exc:
            log.error("request %s failed: %s\n%s", job.request.request_id, exc, traceback.format_exc())
            error = exc if isinstance(exc, EngineError) else EngineError(f"internal error: {type(exc).__name__}")
            job.sink(Failed(error))
        finally:
            _clear_mlx_cache()


def _clear_mlx_cache() -> None:
    import mlx.core as mx

    mx.clear_cache()


def _options(runtime, request: GenerationRequest) -> DecodeOptions:
    s = request.sampling
    settings = SamplerSettings(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p)
    seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(8), "little")
    stop_ids = runtime.eos_ids | frozenset(request.stop_token_ids)
    # The prompt's part of the processors' history is added by the decoder's prefill.
    processors = ProcessorSettings(presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
                                   repetition_penalty=s.repetition_penalty, logit_bias=tuple(s.logit_bias))
    return DecodeOptions(settings=settings, sampler=s.sampler or runtime.spec.sampler, seed=seed, stop_ids=stop_ids,
                         processors=processors, logprobs=request.logprobs)


def run_request(runtime, request: GenerationRequest, cancelled: threading.Event, emit=None):
    """Decode one request; `emit(TokenEvent)` is called once per round. Returns the terminal event.

    Used by the worker (emit posts to the client) and directly by `dspark generate`.
    """
    emit = emit or (lambda ev: None)
    info = runtime.info
    stats = SpecStats(mode=info.mode, cap=info.cap)
    decoder = SpecDecoder(runtime.target, runtime.drafter, runtime.make_scheduler(), _options(runtime, request), stats)
    detok = IncrementalDetokenizer(runtime.tokenizer)
    stops = StopMatcher(list(request.stop))
    total: list[int] = []
    tokens = decoder.prefill(list(request.prompt_ids))  # long matrices: the BLAS as loaded
    with blas_threads(runtime.decode_threads):  # a few rows per product: the measured decode count
        while True:
            total += tokens
            visible = _visible(tokens, decoder, runtime)
            text, stopped = stops.push(detok.add(visible))
            if tokens or text:
                emit(TokenEvent(token_ids=tokens, text=text, logprobs=_event_logprobs(decoder, visible, runtime.tokenizer)))
            if stopped or decoder.done:
                reason = "stop"
                break
            if len(total) >= request.max_tokens:
                reason = "length"
                break
            if cancelled.is_set():
                return Failed(EngineCancelled("cancelled"))
            tokens = decoder.step(request.max_tokens - len(total))
    tail = "" if stops.stopped else stops.push(detok.flush())[0] + stops.flush()
    if stops.stopped:
        reason = "stop"
    usage = Usage(prompt_tokens=len(request.prompt_ids), completion_tokens=len(total))
    return Finished(reason=reason, usage=usage, stats=stats, text=tail)


def run_greedy_timed(runtime, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], Finished, float]:
    """One greedy request through `run_request` on this thread: (token ids, its Finished, wall seconds).

    For benchmarks and evaluations; raises RuntimeError if the request fails.
    """
    import time

    request = GenerationRequest("timed", tuple(prompt_ids), max_tokens, SamplingParams(temperature=0.0))
    ids: list[int] = []
    t0 = time.perf_counter()
    result = run_request(runtime, request, threading.Event(), lambda ev: ids.extend(ev.token_ids))
    wall = time.perf_counter() - t0
    if not isinstance(result, Finished):
        raise RuntimeError(f"generation failed: {result.error}")
    return ids, result, wall


def _visible(tokens: list[int], decoder: SpecDecoder, runtime) -> list[int]:
    # An EOS/stop id ends generation but is not part of the text.
    if decoder.done and tokens and tokens[-1] in decoder.opts.stop_ids:
        return tokens[:-1]
    return tokens


def _event_logprobs(decoder: SpecDecoder, visible: list[int], tokenizer) -> list[TokenLogprob] | None:
    """TokenLogprobs of the visible tokens the decoder just committed (None when not asked for)."""
    if decoder.last_logprobs is None:
        return None
    def text(token_id: int) -> str:  # each id alone, special tokens kept (OpenAI's `token`)
        return tokenizer.decode([token_id], skip_special_tokens=False)

    return [
        TokenLogprob(token_id=t, token=text(t), logprob=lp, top=[(i, text(i), v) for i, v in top])
        for t, (lp, top) in zip(visible, decoder.last_logprobs)
    ]


def exit_process(code: int) -> None:
    """Flush and exit without running C++ static destructors.

    MLX 0.32 can abort at interpreter exit ("terminate called without an active exception") once
    it has evaluated arrays on a non-main thread (ml-explore/mlx#3126), turning a clean shutdown
    into exit code 134. Processes that ran the worker thread call this after their own cleanup.
    """
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
