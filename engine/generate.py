"""The request loop: one request through a loaded runtime, as a generator of events.

`stream_generate(runtime, request)` yields one `TokenEvent` per round (text already detokenized and
stop-matched) and then exactly one `Finished`. Stopping the iteration early (`close()`, or
leaving a for-loop) abandons the request at a round boundary. The worker thread, `dspark
generate`, the benchmark and the held-out evaluation all consume this one loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from engine.api import EngineCancelled, Finished, GenerationRequest, SpecStats, TokenEvent, TokenLogprob, Usage
from engine.backend import blas_threads
from engine.processors import ProcessorSettings
from engine.runtime import Runtime
from engine.samplers import make_sampler
from engine.sampling import SamplerSettings
from engine.spec import DecodeOptions, SpecDecoder
from engine.text import IncrementalDetokenizer, StopMatcher


def stream_generate(runtime: Runtime, request: GenerationRequest,
                    cancelled: Callable[[], bool] | None = None) -> Iterator[TokenEvent | Finished]:
    """TokenEvents of `request`, one per round, then its Finished (always the last item).

    `cancelled` is polled between prefill chunks (EngineCancelled ends a long prefill early); between
    rounds the consumer stops the iteration instead. Whenever the request ends in a consistent state
    (finished, or stopped at a round or chunk boundary, never after an error), its committed state
    goes into the runtime's prefix cache."""
    # A per-request baseline (`request.baseline`) is the same decoder without a drafter.
    baseline = request.baseline and runtime.drafter is not None
    stats = SpecStats(mode="baseline", cap=None) if baseline else SpecStats(mode=runtime.info.mode, cap=runtime.info.cap)
    drafter, scheduler = (None, None) if baseline else (runtime.drafter, runtime.make_scheduler())
    decoder = SpecDecoder(runtime.target, drafter, scheduler, decode_options(runtime, request), stats)
    detok = IncrementalDetokenizer(runtime.tokenizer)
    stops = StopMatcher(list(request.stop))
    total: list[int] = []
    prompt, inputs = list(request.prompt_ids), None
    if request.images:
        prompt, inputs = runtime.expand_images(prompt, request.images)
    # Image positions hold the same placeholder ids whatever the image: such prompts neither match
    # nor leave prefix-cache states. Nor do per-request baselines: their states lack the drafter's.
    cacheable = inputs is None and not baseline
    consistent = False  # whether the decoder may be captured for the prefix cache now
    try:
        try:
            prefix = runtime.match_prefix(prompt) if cacheable else None
            tokens = decoder.prefill(prompt, prefix, cancelled, inputs)  # the BLAS as loaded
        except EngineCancelled:
            consistent = True  # stopped between chunks: the chunks read are a consistent prefix
            raise
        runtime.account_prefill(stats, len(prompt))
        with blas_threads(runtime.decode_threads):  # a few rows per product: the measured decode count
            while True:
                total += tokens
                visible = _visible(tokens, decoder)
                text, stopped = stops.push(detok.add(visible))
                if tokens or text:
                    consistent = True
                    yield TokenEvent(token_ids=tokens, text=text, logprobs=_event_logprobs(decoder, visible, runtime),
                                     drafted=decoder.last_drafted)
                if stopped or decoder.done:
                    reason = "stop"
                    break
                if len(total) >= request.max_tokens:
                    reason = "length"
                    break
                consistent = False
                tokens = decoder.step(request.max_tokens - len(total))
        consistent = True
        runtime.remember(total)  # into the cross-request lookup history, when --lookup-history is on
        tail = "" if stops.stopped else stops.push(detok.flush())[0] + stops.flush()
        if stops.stopped:
            reason = "stop"
        usage = Usage(prompt_tokens=len(prompt), completion_tokens=len(total), cached_tokens=stats.prompt_cached_tokens)
        yield Finished(reason=reason, usage=usage, stats=stats, text=tail, stop_sequence=stops.matched)
    finally:
        if consistent and cacheable:
            runtime.keep_prefix(decoder)


def generate(runtime: Runtime, request: GenerationRequest) -> tuple[list[int], str, Finished]:
    """Run `request` to the end: (token ids, text, Finished)."""
    ids: list[int] = []
    text: list[str] = []
    for event in stream_generate(runtime, request):
        if isinstance(event, Finished):
            return ids, "".join(text) + event.text, event
        ids += event.token_ids
        text.append(event.text)
    raise AssertionError("stream_generate ended without Finished")


def decode_options(runtime: Runtime, request: GenerationRequest) -> DecodeOptions:
    """The decoder's options for a request: its sampler (a fresh seed if none), stops, processors and
    grammar."""
    s = request.sampling
    settings = SamplerSettings(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p)
    seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(8), "little")
    stop_ids = runtime.eos_ids | frozenset(request.stop_token_ids)
    # The prompt's part of the processors' history is added by the decoder's prefill.
    processors = ProcessorSettings(presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
                                   repetition_penalty=s.repetition_penalty, logit_bias=tuple(s.logit_bias))
    sampler = make_sampler(settings, s.sampler or runtime.spec.sampler, seed)
    return DecodeOptions(sampler=sampler, stop_ids=stop_ids, processors=processors, logprobs=request.logprobs,
                         grammar=runtime.compiled_grammar(request.grammar))


def _visible(tokens: list[int], decoder: SpecDecoder) -> list[int]:
    # An EOS/stop id ends generation but is not part of the text.
    if decoder.done and tokens and tokens[-1] in decoder.opts.stop_ids:
        return tokens[:-1]
    return tokens


def _event_logprobs(decoder: SpecDecoder, visible: list[int], runtime: Runtime) -> list[TokenLogprob] | None:
    """TokenLogprobs of the visible tokens the decoder just committed (None when not asked for)."""
    if decoder.last_logprobs is None:
        return None

    def text(token_id: int) -> str:  # each id alone, special tokens kept (OpenAI's `token`)
        return runtime.tokenizer.decode([token_id], skip_special_tokens=False)

    return [
        TokenLogprob(token_id=t, token=text(t), logprob=lp, top=[(i, text(i), v) for i, v in top])
        for t, (lp, top) in zip(visible, decoder.last_logprobs)
    ]
