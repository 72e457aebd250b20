"""The engine worker: the one thread that owns every MLX array, model and cache.

It loads the runtime, then takes requests from its inbox one at a time and runs them round by
round. After each round it posts one event to the request's sink and checks for cancellation, so a
cancelled request is freed within one round. Every request gets exactly one terminal event.
"""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.api import (
    EngineCancelled, EngineConfig, EngineDead, EngineError, Event, Failed, GenerationRequest, WorkerState,
)

if TYPE_CHECKING:
    from engine.runtime import Runtime

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

    def __init__(self, config: EngineConfig, runtime_factory: Callable[[EngineConfig], Runtime] | None = None,
                 on_state: Callable[[WorkerState], None] | None = None):
        super().__init__(name="dspark-engine", daemon=True)
        self.config = config
        self.inbox: queue.Queue = queue.Queue()
        self.runtime: Runtime | None = None
        self.state: WorkerState = "loading"
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

    def _set_state(self, state: WorkerState, reason: str | None) -> None:
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
        from engine.generate import stream_generate

        # Checked between prefill chunks and once per round: freed within one chunk or round.
        events = stream_generate(self.runtime, job.request, cancelled=job.cancelled.is_set)
        try:
            for event in events:
                job.sink(event)
                if job.cancelled.is_set():
                    job.sink(Failed(EngineCancelled("cancelled")))
                    break
        except EngineCancelled as exc:  # during prefill: nobody is listening, nothing went wrong
            job.sink(Failed(exc))
        except Exception as exc:
            log.error("request %s failed: %s\n%s", job.request.request_id, exc, traceback.format_exc())
            error = exc if isinstance(exc, EngineError) else EngineError(f"internal error: {type(exc).__name__}")
            job.sink(Failed(error))
        finally:
            events.close()
            _clear_mlx_cache()


def _clear_mlx_cache() -> None:
    import mlx.core as mx

    mx.clear_cache()
