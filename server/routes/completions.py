"""POST /v1/completions (legacy text completions)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server import convert, generation
from server.body import ignored
from server.deps import AppStateDep, CompletionBody
from server.openapi import error_responses, ok_response, request_body
from server.prompt import render_text
from server.structured import format_grammar

router = APIRouter(tags=["completions"])


@router.post(
    "/v1/completions",
    response_model=None,
    responses={**ok_response("CompletionResponse", "CompletionResponse"),
               **error_responses(400, 401, 404, 413, 415, 421, 429, 500, 503)},
    openapi_extra=request_body("CompletionRequest"),
)
async def create_completion(request: Request, body: CompletionBody, app_state: AppStateDep) -> Response:
    """Complete raw text (no chat template); `prompt` is a string or a list of token ids.

    Streams as SSE when `stream` is true; refusals come before the stream starts.
    """
    engine, info = app_state.ready_engine()
    model = app_state.resolve_model(body.model, info)
    prompt_ids = await render_text(body.prompt, engine, info.context_length)
    request_id = convert.new_id("cmpl")
    fmt = convert.CompletionFormatter(request_id, model, body.include_usage, logprobs=body.num_logprobs is not None,
                                      origins=convert.token_origins(body, engine.decode))
    gen = convert.generation_request(request_id, body, prompt_ids, body.token_limit, info.context_length,
                                     logprobs=body.num_logprobs, grammar=format_grammar(body))
    active = generation.start(app_state, engine, gen, endpoint="completions")
    headers = app_state.ignored_headers(ignored(request))
    return await generation.respond(app_state, active, fmt, request, stream=bool(body.stream), headers=headers)
