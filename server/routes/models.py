"""GET /v1/models and /v1/models/{model}: what is actually served, with drafter and mode."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from engine.api import EngineInfo
from server.deps import RuntimeDep
from server.openapi import error_responses
from server.protocol import ModelCard, ModelList
from server.runtime import Runtime

router = APIRouter(tags=["models"])


@router.get("/v1/models", response_model=ModelList, responses=error_responses(401, 421, 503))
async def list_models(runtime: RuntimeDep) -> dict[str, Any]:
    """The served model (one), with its drafter, mode, draft cap, sampler and context length."""
    _, info = runtime.ready_engine()
    return ModelList(data=[_card(runtime, info)]).model_dump(mode="json")


@router.get("/v1/models/{model:path}", response_model=ModelCard, responses=error_responses(401, 404, 421, 503))
async def retrieve_model(model: str, runtime: RuntimeDep) -> dict[str, Any]:
    """One model by id (or an accepted alias); 404 model_not_found otherwise."""
    _, info = runtime.ready_engine()
    runtime.resolve_model(model, info)
    return _card(runtime, info).model_dump(mode="json")


def _card(runtime: Runtime, info: EngineInfo) -> ModelCard:
    details = {"mode": info.mode, "drafter": info.drafter, "cap": info.cap, "sampler": info.sampler,
               "context_length": info.context_length, "path": info.model_path,
               "aliases": sorted(runtime.model_names(info) - {info.model_id})}
    return ModelCard(id=info.model_id, created=runtime.started_at, dspark=details)
