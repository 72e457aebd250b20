"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server import convert, generation, vision
from server.body import ignored
from server.deps import AppStateDep, ChatBody
from server.openapi import error_responses, ok_response, request_body
from server.prompt import render_chat
from server.structured import chat_grammar

router = APIRouter(tags=["chat"])


@router.post(
    "/v1/chat/completions",
    response_model=None,
    responses={**ok_response("ChatCompletionResponse", "ChatCompletionChunk"),
               **error_responses(400, 401, 404, 413, 415, 421, 429, 500, 503)},
    openapi_extra=request_body("ChatCompletionRequest"),
)
async def create_chat_completion(request: Request, body: ChatBody, app_state: AppStateDep) -> Response:
    """Create a chat completion (OpenAI protocol), streamed as SSE when `stream` is true.

    Every refusal (400, 404, 429, 503) is returned before a stream starts; the final chunk and
    the JSON reply carry `dspark_stats`, the request's speculative-decoding statistics. Image parts are
    fetched and checked (server/images.py) before the request is queued, for a model that takes images. Tool calls
    and reasoning are parsed out of the text; fields the server ignored are named in `X-Dspark-Ignored`.
    """
    engine, info = app_state.ready_engine()
    model = app_state.resolve_model(body.model, info)
    refs = vision.image_refs(body)
    vision.require_vision(refs, info)  # before anything is rendered or fetched
    prompt_ids, spec = await render_chat(body, engine, info.context_length)
    images = await vision.load_images(refs, app_state.settings.image_limits())  # before taking an engine place
    request_id = convert.new_id("chatcmpl")
    fmt = convert.ChatFormatter(request_id, model, body.include_usage, spec, logprobs=body.num_logprobs is not None,
                                origins=convert.token_origins(body, engine.decode))
    gen = convert.generation_request(request_id, body, prompt_ids, body.token_limit, info.context_length,
                                     logprobs=body.num_logprobs, grammar=chat_grammar(body, spec), images=images)
    active = generation.start(app_state, engine, gen, endpoint="chat")
    headers = app_state.ignored_headers(ignored(request))
    return await generation.respond(app_state, active, fmt, request, stream=bool(body.stream), headers=headers)
