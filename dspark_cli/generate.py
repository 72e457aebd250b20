"""`dspark generate`: decode one prompt on the target from the command line.

For now this is plain greedy decoding through mlx-lm; the speculative engine replaces it.
"""

from __future__ import annotations

import json
import sys
import time

from dspark_cli.progress import stderr_progress


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt")
    p.add_argument("--prompt", required=True, help="the user message (or raw text with --raw)")
    p.add_argument("--model", default=None, help="mlx-lm model directory or Hugging Face id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--max-tokens", type=int, default=256, help="maximum tokens to generate")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object with text, tokens and statistics")
    p.set_defaults(run=run)


def run(args) -> int:
    from engine.loading.target import load_target  # engine first: it loads the BLAS before MLX

    import mlx.core as mx

    model, tokenizer, _ = load_target(args.model, stderr_progress)
    from mlx_lm.generate import stream_generate

    if args.raw:
        prompt = tokenizer.encode(args.prompt)
    else:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True)
    t0 = time.perf_counter()
    text, tokens, last = "", [], None
    for last in stream_generate(model, tokenizer, prompt, max_tokens=args.max_tokens, sampler=lambda x: mx.argmax(x, axis=-1)):
        text += last.text
        tokens.append(int(last.token))
        if not args.json:
            sys.stdout.write(last.text)
            sys.stdout.flush()
    stats = {
        "prompt_tokens": len(prompt),
        "generated_tokens": len(tokens),
        "decode_tokens_per_s": round(last.generation_tps, 2) if last else 0.0,
        "wall_s": round(time.perf_counter() - t0, 3),
        "finish_reason": (last.finish_reason if last else None) or "length",
    }
    if args.json:
        print(json.dumps({"text": text, "tokens": tokens, **stats}))
    else:
        print()
        print(json.dumps(stats), file=sys.stderr)
    return 0
