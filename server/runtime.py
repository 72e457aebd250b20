"""What the routes share (`AppState`: settings, the engine, metrics and the drain, plus the
admission steps).

`EngineLike` is the engine contract the server codes against (`engine.client.EngineClient`, or a
scripted fake in tests).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from engine.api import (
    EngineError,
    EngineInfo,
    EngineNotReady,
    EngineOverloaded,
    Finished,
    GenerationRequest,
    TokenEvent,
)
from server import errors, policy
from server.drain import Drain
from server.errors import APIError
from server.metrics import Metrics
from server.settings import ServerSettings

LOADING_RETRY_AFTER_S = 5
MODEL_ALIASES = ("default",)  # always accepted as `model`, besides the served id and --model


class EngineLike(Protocol):
    """The public API of `engine.client.EngineClient` that the server uses."""

    @property
    def state(self) -> str: ...  # "loading", "ready" or "dead"

    @property
    def dead_reason(self) -> str | None: ...

    def start(self) -> None: ...

    async def wait_ready(self) -> str: ...  # once loading ends: "ready" or "dead"

    def info(self) -> EngineInfo | None: ...

    def encode_chat(
        self, messages: list[dict[str, Any]], chat_template_kwargs: dict[str, Any] | None = None
    ) -> list[int]: ...

    def encode_text(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def chat_template(self) -> str | None: ...

    def submit(self, request: GenerationRequest) -> Any: ...

    async def next_event(self, handle: Any, timeout: float | None = None) -> TokenEvent | Finished | None: ...

    def interrupt(self, handle: Any, exc: BaseException) -> None: ...

    def cancel(self, handle: Any) -> None: ...

    def queue_depth(self) -> int: ...

    async def shutdown(self) -> None: ...


class AppState:
    """Per-app state. `engine` is None until the lifespan creates it (unless injected)."""

    def __init__(self, settings: ServerSettings, engine: EngineLike | None = None) -> None:
        self.settings = settings
        self.engine = engine
        self.metrics = Metrics(lambda: self.engine)
        self.drain = Drain(settings.drain_grace_s)
        self.started_at = int(time.time())

    @property
    def state(self) -> str:
        """The engine's state: "loading" (also before it exists), "ready" or "dead"."""
        return self.engine.state if self.engine is not None else "loading"

    def ready_engine(self) -> tuple[EngineLike, EngineInfo]:
        """The engine and what it serves, or 503 (loading, dead or draining)."""
        engine = self.engine
        info = engine.info() if engine is not None and engine.state == "ready" else None
        if self.drain.draining:
            raise errors.not_ready("draining", None, LOADING_RETRY_AFTER_S)
        if engine is None or info is None:
            reason = engine.dead_reason if engine is not None else None
            raise errors.not_ready(self.state, reason, LOADING_RETRY_AFTER_S)
        return engine, info

    def model_names(self, info: EngineInfo) -> set[str]:
        """Every `model` value that selects the served model."""
        names = {info.model_id, *MODEL_ALIASES}
        if self.settings.model:
            names.add(self.settings.model)
        return names

    def resolve_model(self, name: str | None, info: EngineInfo) -> str:
        """The served model id for a requested name (none: the served model), or 404 model_not_found."""
        if name is None or name in self.model_names(info):
            return info.model_id
        raise APIError(404, f"The model '{name}' does not exist; this server serves '{info.model_id}'.",
                       param="model", code="model_not_found")

    def ignored_headers(self, names: list[str]) -> dict[str, str]:
        """Log and count the request fields that were ignored; the response header that lists them."""
        if not names:
            return {}
        policy.log_once(names)
        self.metrics.ignored_fields(names)
        return {policy.HEADER: policy.header_value(names)}

    def submit(self, engine: EngineLike, request: GenerationRequest) -> Any:
        """Admit a request (`engine.submit`), turning refusals into 400/429/503 with Retry-After."""
        try:
            return engine.submit(request)
        except EngineError as exc:
            raise errors.from_engine_error(exc, retry_after_s=self._retry_after(engine, exc)) from exc

    def _retry_after(self, engine: EngineLike, exc: EngineError) -> int | None:
        if isinstance(exc, EngineOverloaded):
            return self.metrics.retry_after_s(engine.queue_depth())
        if isinstance(exc, EngineNotReady):
            return LOADING_RETRY_AFTER_S
        return None
