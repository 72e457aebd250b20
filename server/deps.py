"""FastAPI dependencies: the app's runtime and the validated request bodies."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from server.body import body_of
from server.protocol import ChatCompletionRequest, CompletionRequest
from server.runtime import Runtime


def get_runtime(request: Request) -> Runtime:
    """The runtime `create_app` stored on the app."""
    runtime: Runtime = request.app.state.runtime
    return runtime


def _body_limit(request: Request) -> int:
    return get_runtime(request).settings.max_body_bytes


def _strict(request: Request) -> bool:
    return bool(get_runtime(request).settings.strict_params)


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
ChatBody = Annotated[ChatCompletionRequest, Depends(body_of(ChatCompletionRequest, _body_limit, _strict))]
CompletionBody = Annotated[CompletionRequest, Depends(body_of(CompletionRequest, _body_limit, _strict))]
