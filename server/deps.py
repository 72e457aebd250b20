"""FastAPI dependencies: the app's shared state and the validated request bodies."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from server.body import body_of
from server.messages.protocol import CountTokensRequest, MessagesRequest
from server.protocol import ChatCompletionRequest, CompletionRequest
from server.responses.protocol import ResponsesRequest
from server.runtime import AppState


def get_app_state(request: Request) -> AppState:
    """The AppState `create_app` stored on the app."""
    app_state: AppState = request.app.state.app_state
    return app_state


def _body_limit(request: Request) -> int:
    return get_app_state(request).settings.max_body_bytes


def _strict(request: Request) -> bool:
    return bool(get_app_state(request).settings.strict_params)


AppStateDep = Annotated[AppState, Depends(get_app_state)]
ChatBody = Annotated[ChatCompletionRequest, Depends(body_of(ChatCompletionRequest, _body_limit, _strict))]
CompletionBody = Annotated[CompletionRequest, Depends(body_of(CompletionRequest, _body_limit, _strict))]
MessagesBody = Annotated[MessagesRequest, Depends(body_of(MessagesRequest, _body_limit, _strict))]
CountTokensBody = Annotated[CountTokensRequest, Depends(body_of(CountTokensRequest, _body_limit, _strict))]
ResponsesBody = Annotated[ResponsesRequest, Depends(body_of(ResponsesRequest, _body_limit, _strict))]
