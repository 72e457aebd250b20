"""GET /health (open even with --api-key) and GET /metrics (Prometheus text)."""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from server.deps import AppStateDep
from server.metrics import CONTENT_TYPE
from server.openapi import error_responses
from server.protocol import Health
from server.runtime import AppState

router = APIRouter(tags=["operations"])


@router.get("/health", response_model=Health, responses={503: {"model": Health, "description": "Not ready"}})
async def health(app_state: AppStateDep) -> JSONResponse:
    """200 when the engine is ready; 503 while loading, after it died, or while draining.

    The body says what is really served (mode, drafter kind and effective draft cap), never a silent
    fallback.
    """
    body = _health(app_state)
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if body.status == "ok" else 503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format"},
               **error_responses(401)},
)
async def prometheus_metrics(app_state: AppStateDep) -> Response:
    """Prometheus metrics: requests, queue, latencies, tokens and speculative acceptance."""
    return Response(app_state.metrics.render(), media_type=CONTENT_TYPE)


def _health(app_state: AppState) -> Health:
    """What is served (or, until ready, what was asked for) and whether requests are admitted."""
    engine, settings, state = app_state.engine, app_state.settings, app_state.state
    info = engine.info() if engine is not None and state == "ready" else None
    if app_state.drain.draining:
        status = "draining"
    else:
        status = "ok" if info is not None else ("dead" if state == "dead" else "loading")
    return Health.model_validate({
        "status": status,
        "state": state,
        "model": info.model_id if info else settings.model,
        "mode": info.mode if info else settings.mode,
        "drafter": info.drafter if info else settings.drafter,
        "cap": info.cap if info else None,
        "sampler": info.sampler if info else settings.sampler,
        "context_length": info.context_length if info else None,
        "queue_depth": engine.queue_depth() if engine is not None and state == "ready" else 0,
        "max_queue": settings.max_queue,
        "draining": app_state.drain.draining,
        "dead_reason": engine.dead_reason if engine is not None and state == "dead" else None,
        "requested_mode": info.requested_mode if info else None,
        "mode_note": info.mode_note if info else None,
        "drafter_kind": info.drafter_kind if info else None,
        "draft_vocab": info.draft_vocab if info else None,
        "lookup_history": _history(info),
        "prefix_cache": dataclasses.asdict(info.prefix_cache) if info is not None and info.prefix_cache else None,
    })


def _history(info) -> dict | None:
    """The lookup history's size, when it is on (`dataclasses.asdict` of the engine's HistoryUsage)."""
    usage = info.lookup_history if info is not None else None
    return dataclasses.asdict(usage) if usage is not None else None
