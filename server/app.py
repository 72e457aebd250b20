"""`create_app`: the FastAPI app over one engine.

The lifespan creates and starts `engine.client.EngineClient(settings.to_engine_config())` unless
an engine was injected (tests inject a scripted fake), and shuts it down at exit. Loading runs in
the engine's worker thread, so the server answers /health (503) while the models load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from starlette.middleware.cors import CORSMiddleware

from engine.api import EngineInfo
from server import errors, metrics, openapi
from server.errors import APIError
from server.messages.format import error_envelope
from server.middleware import AnthropicErrorMiddleware, ApiKeyMiddleware, HostGuardMiddleware, guarded_hosts
from server.routes import chat, completions, health, messages, models, responses, ui
from server.runtime import AppState, EngineLike
from server.settings import ServerSettings

log = logging.getLogger(__name__)

ReadyHook = Callable[[EngineInfo], None]

GENERATION_ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/messages": "messages",
                        "/v1/responses": "responses"}

# Request headers a browser may send cross-origin (named: Starlette does not take wildcards such as
# X-Stainless-*): the OpenAI JS SDK's, and the Anthropic SDK's for clients that share one config.
CORS_REQUEST_HEADERS = (
    "Authorization", "Content-Type", "OpenAI-Organization", "OpenAI-Project", "OpenAI-Beta",
    "X-Stainless-Lang", "X-Stainless-Package-Version", "X-Stainless-OS", "X-Stainless-Arch", "X-Stainless-Runtime",
    "X-Stainless-Runtime-Version", "X-Stainless-Retry-Count", "X-Stainless-Timeout", "X-Stainless-Helper-Method",
    "X-Stainless-Async", "anthropic-version", "anthropic-beta", "x-api-key",
    "anthropic-dangerous-direct-browser-access",
)
# Response headers page scripts may read (browsers hide all but a few safelisted ones otherwise).
CORS_EXPOSED_HEADERS = ("Retry-After", "X-Dspark-Ignored")

DESCRIPTION = (
    "OpenAI-compatible server with lossless speculative decoding (DSpark, DFlash) on MLX. "
    "Errors are OpenAI-shaped (Anthropic-shaped on /v1/messages). Fields the server does not model are ignored and listed in X-Dspark-Ignored "
    "(refused under --strict-params); what would be served wrongly gets a 400 naming the field."
)


def create_app(settings: ServerSettings | None = None, engine: EngineLike | None = None, *,
               on_ready: ReadyHook | None = None) -> FastAPI:
    """The app; `engine` replaces the real engine client (it is then neither started nor owned)."""
    settings = settings or ServerSettings()
    app_state = AppState(settings, engine)
    app = FastAPI(title="dspark-serve", version="0.1.0", description=DESCRIPTION,
                  lifespan=_make_lifespan(app_state, owns_engine=engine is None, on_ready=on_ready))
    app.state.app_state = app_state
    errors.install(app, on_error=lambda request, exc: _count_refusal(app_state, request, exc))
    for module in (chat, completions, messages, responses, models, health):
        app.include_router(module.router)
    if settings.ui:  # the chat page at / (server/static/); --no-ui leaves / a 404
        app.include_router(ui.router)
    _add_middleware(app, settings)
    app.openapi = lambda: openapi.build(app)  # type: ignore[method-assign]
    return app


def _add_middleware(app: FastAPI, settings: ServerSettings) -> None:
    """Each one added wraps the ones before: the host guard, then CORS, then the API key."""
    if settings.api_key:  # the page's files need no key: the page asks for it and sends it to the API
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key, is_open=ui.is_page_path if settings.ui else None)
    if settings.allowed_origins:  # outside the key check: preflights and 401s carry CORS headers
        app.add_middleware(CORSMiddleware, allow_origins=settings.allowed_origins, allow_methods=["GET", "POST"],
                           allow_headers=list(CORS_REQUEST_HEADERS), expose_headers=list(CORS_EXPOSED_HEADERS))
    # Around the API key's 401 too, so Anthropic clients read every refusal on their paths.
    app.add_middleware(AnthropicErrorMiddleware, prefix="/v1/messages", envelope=error_envelope)
    hosts = guarded_hosts(settings.host, settings.allowed_hosts)
    if hosts is not None:  # outermost: a rebinding page gets no answer at all, preflights included
        app.add_middleware(HostGuardMiddleware, allowed=hosts)


Lifespan = Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]


def _make_lifespan(app_state: AppState, owns_engine: bool, on_ready: ReadyHook | None) -> Lifespan:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app_state.drain.bind(asyncio.get_running_loop())
        engine = app_state.engine
        if engine is None:
            from engine.client import EngineClient  # the real engine only when none was injected

            engine = app_state.engine = EngineClient(app_state.settings.to_engine_config())
        if owns_engine:
            engine.start()
        watcher = asyncio.create_task(_announce_when_ready(app_state, engine, on_ready))
        try:
            yield
        finally:
            watcher.cancel()
            if owns_engine:
                await engine.shutdown()

    return lifespan


async def _announce_when_ready(app_state: AppState, engine: EngineLike, on_ready: ReadyHook | None) -> None:
    """Log (and call `on_ready`) once the engine has loaded, or log why it died."""
    state = await engine.wait_ready()
    info = engine.info() if state == "ready" else None
    if info is None:
        log.error("engine failed to start: %s", engine.dead_reason or f"state {state}")
        return
    log.info("serving %s (mode %s, drafter %s, cap %s) at %s", info.model_id, info.mode, info.drafter, info.cap,
             app_state.settings.base_url())
    if on_ready is not None:
        on_ready(info)


def _count_refusal(app_state: AppState, request: Request, exc: APIError) -> None:
    """Count generation requests refused before admission.

    Admitted ones are counted by their recorder, and their late errors are answered by
    `generation.respond` itself, so they never reach this hook.
    """
    endpoint = GENERATION_ENDPOINTS.get(request.url.path)
    if endpoint is not None:
        app_state.metrics.count(endpoint, metrics.outcome_for_status(exc.status))
