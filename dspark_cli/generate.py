"""`dspark generate`: decode one prompt with any mode and sampler from the command line."""

from __future__ import annotations

import json
import sys
import time

from dspark_cli.progress import stderr_progress
from dspark_cli.spec_args import add_spec_args, engine_config


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt")
    p.add_argument("--prompt", required=True, help="the user message (raw text with --raw)")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--max-tokens", type=int, default=256, help="maximum tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="sampling seed (reproducible output)")
    p.add_argument("--json", action="store_true", help="print one JSON object with text, tokens and statistics")
    add_spec_args(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from engine.api import EngineError, Finished, GenerationRequest, SamplingParams
    from engine.generate import stream_generate
    from engine.runtime import build_runtime
    from engine.text import apply_chat_template

    runtime = build_runtime(engine_config(args), stderr_progress)
    tok = runtime.tokenizer
    if args.raw:
        prompt = list(tok.encode(args.prompt))
    else:
        prompt = apply_chat_template(tok, [{"role": "user", "content": args.prompt}])
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              min_p=args.min_p, seed=args.seed, sampler=args.sampler)
    request = GenerationRequest("cli", tuple(prompt), args.max_tokens, sampling)
    text, tokens = [], []
    t0 = time.perf_counter()
    try:
        for result in stream_generate(runtime, request):
            if isinstance(result, Finished):
                break
            tokens.extend(result.token_ids)
            text.append(result.text)
            if not args.json:
                sys.stdout.write(result.text)
                sys.stdout.flush()
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - t0
    text.append(result.text)
    summary = {"finish_reason": result.reason, "prompt_tokens": len(prompt), "wall_s": round(wall, 3),
               "model": runtime.info.model_id, "drafter": runtime.info.drafter, **result.stats.as_dict()}
    if args.json:
        print(json.dumps({"text": "".join(text), "tokens": tokens, **summary}))
    else:
        print(result.text)
        print(json.dumps(summary), file=sys.stderr)
    return 0
