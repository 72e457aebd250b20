"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the chat path.

The request becomes the server's chat request (`server.messages.convert`) and runs exactly as a chat
completion does (template, grammar for a forced tool call, engine, parsers); only the reply's shape
differs (`server.messages.format`). Errors on these paths use Anthropic's envelope
(`AnthropicErrorMiddleware`).
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server import convert, generation, vision
from server.body import ignored
from server.deps import AppStateDep, CountTokensBody, MessagesBody
from server.messages.convert import chat_request, image_params
from server.messages.format import MessagesFormatter, openapi_responses
from server.openapi import request_body
from server.prompt import render_chat
from server.structured import chat_grammar

router = APIRouter(tags=["messages"])


@router.post("/v1/messages", response_model=None, openapi_extra=request_body("MessagesRequest"),
             responses=openapi_responses(400, 401, 404, 413, 415, 421, 429, 500, 503))
async def create_message(request: Request, body: MessagesBody, app_state: AppStateDep) -> Response:
    """Create a message (Anthropic protocol), streamed as named SSE events when `stream` is true.

    `dspark_stats` rides on the message (and on the stream's `message_delta`); fields the server
    ignored are named in `X-Dspark-Ignored`."""
    engine, info = app_state.ready_engine()
    model = app_state.resolve_model(body.model, info)
    chat = chat_request(body)
    refs = vision.image_refs(chat, image_params(body))
    vision.require_vision(refs, info)
    prompt_ids, spec = await render_chat(chat, engine, info.context_length)
    images = await vision.load_images(refs, app_state.settings.image_limits())
    request_id = "msg_" + uuid.uuid4().hex  # Anthropic's id shape
    fmt = MessagesFormatter(request_id, model, spec, prompt_tokens=len(prompt_ids))
    gen = convert.generation_request(request_id, chat, prompt_ids, body.max_tokens, info.context_length,
                                     grammar=chat_grammar(chat, spec), images=images)
    active = generation.start(app_state, engine, gen, endpoint="messages")
    headers = app_state.ignored_headers(ignored(request))
    return await generation.respond(app_state, active, fmt, request, stream=bool(body.stream), headers=headers)


@router.post("/v1/messages/count_tokens", response_model=None, openapi_extra=request_body("CountTokensRequest"),
             responses={**openapi_responses(400, 401, 404, 413, 415, 421, 500, 503), 200: {
                 "description": "The prompt tokens", "content": {"application/json": {"schema": {
                     "type": "object", "required": ["input_tokens"],
                     "properties": {"input_tokens": {"type": "integer", "minimum": 0}}}}}}})
async def count_tokens(request: Request, body: CountTokensBody, app_state: AppStateDep) -> Response:
    """The prompt tokens the conversation renders to (`{"input_tokens": n}`), tools and system included."""
    engine, info = app_state.ready_engine()
    app_state.resolve_model(body.model, info)
    chat = chat_request(body)
    vision.require_vision(vision.image_refs(chat, image_params(body)), info)  # counted, not fetched
    prompt_ids, _ = await render_chat(chat, engine, info.context_length)
    return JSONResponse({"input_tokens": len(prompt_ids)}, headers=app_state.ignored_headers(ignored(request)))
