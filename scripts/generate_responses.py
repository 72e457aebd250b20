"""Answer prompt JSONL files with the target's own greedy responses, batched (resumable).

Distilling on the target's own outputs aligns the drafter with what it must predict at serving
time. Each output line is the input item with the assistant message appended.

Usage: python scripts/generate_responses.py IN.jsonl OUT.jsonl [--model M] [--max-tokens N] [--batch B]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import engine  # noqa: F401  (fast BLAS before mlx.core)
from engine.loading.target import load_target
from engine.text import apply_chat_template


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args()
    from mlx_lm.generate import batch_generate

    items = [json.loads(line) for line in open(args.inp)][: args.limit]
    try:
        done = sum(1 for _ in open(args.out))
    except FileNotFoundError:
        done = 0
    model, tok, _ = load_target(args.model)
    t0, tokens = time.time(), 0
    with open(args.out, "a") as fh:
        for start in range(done, len(items), args.batch):
            batch = items[start : start + args.batch]
            prompts = [apply_chat_template(tok, it["messages"]) for it in batch]
            resp = batch_generate(model, tok, prompts, max_tokens=args.max_tokens, return_token_ids=True)
            for it, text in zip(batch, resp.texts):
                it = dict(it, messages=it["messages"] + [{"role": "assistant", "content": text}])
                fh.write(json.dumps(it) + "\n")
                tokens += len(tok.encode(text))
            fh.flush()
            rate = tokens / (time.time() - t0)
            print(f"{start + len(batch)}/{len(items)} prompts, {tokens} tokens, {rate:.0f} tok/s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
