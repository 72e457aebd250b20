"""GET /v1/models and /v1/models/{model}: what is actually served, with drafter and mode."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from engine.api import EngineInfo
from server.deps import AppStateDep
from server.openapi import error_responses
from server.protocol import ModelCard, ModelList
from server.runtime import AppState

router = APIRouter(tags=["models"])


@router.get("/v1/models", response_model=ModelList, responses=error_responses(401, 421, 503))
async def list_models(app_state: AppStateDep) -> dict[str, Any]:
    """The served model (one), with its drafter, mode, draft cap, sampler and context length."""
    _, info = app_state.ready_engine()
    return ModelList(data=[_card(app_state, info)]).model_dump(mode="json")


@router.get("/v1/models/{model:path}", response_model=ModelCard, responses=error_responses(401, 404, 421, 503))
async def retrieve_model(model: str, app_state: AppStateDep) -> dict[str, Any]:
    """One model by id (or an accepted alias); 404 model_not_found otherwise."""
    _, info = app_state.ready_engine()
    app_state.resolve_model(model, info)
    return _card(app_state, info).model_dump(mode="json")


def _card(app_state: AppState, info: EngineInfo) -> ModelCard:
    details = {"mode": info.mode, "drafter": info.drafter, "drafter_kind": info.drafter_kind, "cap": info.cap,
               "sampler": info.sampler, "context_length": info.context_length, "path": info.model_path,
               "aliases": sorted(app_state.model_names(info) - {info.model_id})}
    return ModelCard(id=info.model_id, created=app_state.started_at, dspark=details)
