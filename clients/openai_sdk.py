"""The official `openai` Python SDK against dspark-serve: chat, streaming with usage, seeded sampling.

    pip install openai
    python clients/openai_sdk.py --prompt "What is the capital of France?" --max-tokens 16

The base URL and key come from OPENAI_BASE_URL / OPENAI_API_KEY (the SDK's own variables), so the
same script runs against any OpenAI-compatible server. HTTP only: nothing here imports dspark-serve.
"""

from __future__ import annotations

import argparse
import os

from openai import OpenAI

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


def make_client() -> OpenAI:
    """A client for OPENAI_BASE_URL (default: the local server); the key only matters with --api-key."""
    return OpenAI(base_url=os.environ.get("OPENAI_BASE_URL", DEFAULT_BASE_URL),
                  api_key=os.environ.get("OPENAI_API_KEY", "unused"))


def chat(client: OpenAI, prompt: str, max_tokens: int) -> None:
    """One greedy, non-streamed reply with its usage and dspark-serve's speculative statistics."""
    reply = client.chat.completions.create(model="default", messages=[{"role": "user", "content": prompt}],
                                           temperature=0, max_tokens=max_tokens)
    print(f"chat> {reply.choices[0].message.content}")
    u = reply.usage
    print(f"usage> prompt={u.prompt_tokens} completion={u.completion_tokens} total={u.total_tokens}")
    stats = (reply.model_extra or {}).get("dspark_stats")  # absent on servers other than dspark-serve
    if stats:
        print(f"stats> mode={stats['mode']} rounds={stats['rounds']} "
              f"mean_accepted_length={stats['mean_accepted_length']} tokens_per_s={stats['tokens_per_s']}")


def stream(client: OpenAI, prompt: str, max_tokens: int) -> None:
    """The same request streamed; the last chunk (empty `choices`) carries the usage."""
    parts, usage = [], None
    for chunk in client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": prompt}], temperature=0,
            max_tokens=max_tokens, stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        if chunk.usage:
            usage = chunk.usage
    print(f"stream> {''.join(parts)}")
    print(f"stream-usage> completion={usage.completion_tokens if usage else None}")


def seeded(client: OpenAI, prompt: str, max_tokens: int, seed: int) -> None:
    """Sampling at temperature 0.8 with a fixed seed, twice: the server returns the same text."""
    texts = [client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": prompt}], temperature=0.8, seed=seed,
        max_tokens=max_tokens).choices[0].message.content for _ in range(2)]
    for text in texts:
        print(f"seed {seed}> {text}")
    print(f"same-seed-same-text> {texts[0] == texts[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default="What is the capital of France?")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    client = make_client()
    chat(client, args.prompt, args.max_tokens)
    stream(client, args.prompt, args.max_tokens)
    seeded(client, args.prompt, args.max_tokens, args.seed)


if __name__ == "__main__":
    main()
