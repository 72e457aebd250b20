"""A tiny terminal chat with dspark-serve: streams each reply, then shows tokens/s and acceptance.

    python clients/chat.py                      # type a message, Enter; Ctrl-D or /quit to leave
    python clients/chat.py --system "Be brief." --temperature 0.7 --seed 1

After each reply a status line shows the tokens generated, the client-side tokens/s (first request
byte to last token), the server's decode tokens/s, and, in a speculative mode, the share of drafted
tokens the target accepted and the mean accepted length per round. OPENAI_BASE_URL and
OPENAI_API_KEY pick the server. HTTP only: nothing here imports dspark-serve.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from openai import OpenAI

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


def status_line(num_tokens: int, wall_s: float, stats: dict[str, Any] | None) -> str:
    """The line shown after a reply, from the usage, the client's timing and `dspark_stats`."""
    parts = [f"{num_tokens} tokens", f"{num_tokens / wall_s:.1f} tok/s" if wall_s > 0 else "- tok/s"]
    if stats is None:  # a server without the dspark extension
        return "[" + ", ".join(parts) + "]"
    parts.append(f"server {stats['tokens_per_s']:.1f} tok/s")
    if stats["drafted_tokens"]:
        accepted = stats["accepted_tokens"] / stats["drafted_tokens"]
        parts.append(f"{stats['mode']} cap {stats['cap']}: acceptance {accepted:.0%}, "
                     f"{stats['mean_accepted_length']:.2f} accepted/round")
    else:  # baseline decoding drafts nothing, so there is no acceptance to show
        parts.append(f"{stats['mode']}: no drafts")
    return "[" + ", ".join(parts) + "]"


def reply(client: OpenAI, messages: list[dict[str, str]], args: argparse.Namespace) -> str:
    """Stream one reply to stdout, then print its status line; returns the reply text."""
    t0 = time.perf_counter()
    text, num_tokens, stats = [], 0, None
    stream = client.chat.completions.create(
        model="default", messages=messages, stream=True, stream_options={"include_usage": True},
        temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens)
    for chunk in stream:
        if chunk.choices:
            piece = chunk.choices[0].delta.content or ""
            text.append(piece)
            print(piece, end="", flush=True)
        # dspark-serve puts its statistics on the finish chunk and the usage on the last chunk.
        stats = (chunk.model_extra or {}).get("dspark_stats") or stats
        if chunk.usage:
            num_tokens = chunk.usage.completion_tokens
    print()
    print(status_line(num_tokens, time.perf_counter() - t0, stats), flush=True)
    return "".join(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", help="a system message for the conversation")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=None, help="fixed sampling seed (reproducible replies)")
    args = parser.parse_args()
    client = OpenAI(base_url=os.environ.get("OPENAI_BASE_URL", DEFAULT_BASE_URL),
                    api_key=os.environ.get("OPENAI_API_KEY", "unused"))
    messages = [{"role": "system", "content": args.system}] if args.system else []
    interactive = sys.stdin.isatty()
    while True:
        try:
            line = input("you> " if interactive else "")
        except EOFError:
            return 0
        if line.strip() in ("/quit", "/exit"):
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        messages.append({"role": "assistant", "content": reply(client, messages, args)})


if __name__ == "__main__":
    sys.exit(main())
