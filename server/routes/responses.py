"""POST /v1/responses (OpenAI's Responses API, stateless): a chat completion in the Responses shapes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from engine.api import EngineError
from server import convert, errors, generation, vision
from server.body import ignored
from server.deps import AppStateDep, ResponsesBody
from server.errors import APIError
from server.openapi import error_responses
from server.prompt import render_chat
from server.responses import convert as responses
from server.responses.format import ResponsesFormatter, new_id
from server.responses.protocol import event_schema, request_schema, response_schema
from server.structured import chat_grammar

router = APIRouter(tags=["responses"])

STREAM_DESCRIPTION = (
    "The response, or with `stream: true` server-sent events, each named by its `type` (`event: <type>`) and "
    "numbered by `sequence_number`: `response.created`, `response.in_progress`, per output item "
    "`response.output_item.added`, its content part and text or arguments deltas and their `.done` events, "
    "`response.output_item.done`, then `response.completed` (or `response.incomplete`) with the whole response. "
    "An error after the stream started is one `error` event, after which the stream closes. Comment lines "
    "(`: keep-alive`, `: queued position=N`) are not events."
)


def _ok_response() -> dict[int | str, dict[str, Any]]:
    """`responses=` entry for 200, its schemas inline (the app's components are the chat models)."""
    data = {"type": "string", "contentMediaType": "application/json", "contentSchema": event_schema()}
    item = {"type": "object", "required": ["event", "data"], "properties": {"event": {"type": "string"}, "data": data}}
    content = {"application/json": {"schema": response_schema()}, "text/event-stream": {"itemSchema": item}}
    return {200: {"description": STREAM_DESCRIPTION, "content": content}}


@router.post(
    "/v1/responses",
    response_model=None,
    responses={**_ok_response(), **error_responses(400, 401, 404, 413, 415, 421, 429, 500, 503)},
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": request_schema()}}}},
)
async def create_response(request: Request, body: ResponsesBody, app_state: AppStateDep) -> Response:
    """Create a response (OpenAI Responses API), streamed as SSE when `stream` is true.

    The request becomes the equivalent chat completion request and is generated exactly as one;
    the server keeps nothing, so `previous_response_id` is refused: send the whole conversation in
    `input`. Refusals come before a stream starts and name the Responses field; the final response
    carries `dspark_stats`; fields the server ignored are named in `X-Dspark-Ignored`.
    """
    engine, info = app_state.ready_engine()
    model = app_state.resolve_model(body.model, info)
    chat = responses.chat_request(body)
    refs = vision.image_refs(chat, responses.image_params(body))
    vision.require_vision(refs, info)  # named as the Responses request names them
    try:
        prompt_ids, spec = await render_chat(chat, engine, info.context_length)
        images = await vision.load_images(refs, app_state.settings.image_limits())
        response_id = new_id("resp")
        fmt = ResponsesFormatter(response_id, model, body, spec)
        limit = responses.token_limit(chat.token_limit, len(prompt_ids), info.context_length)
        gen = convert.generation_request(response_id, chat, prompt_ids, limit, info.context_length,
                                         grammar=chat_grammar(chat, spec), images=images)
        active = generation.start(app_state, engine, gen, endpoint="responses")
    except APIError as error:  # chat's field names, as the Responses request calls them
        raise responses.renamed(error) from None
    except EngineError as exc:
        raise responses.renamed(errors.from_engine_error(exc)) from exc
    headers = app_state.ignored_headers(ignored(request))
    return await generation.respond(app_state, active, fmt, request, stream=bool(body.stream), headers=headers)
