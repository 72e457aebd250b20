"""`langchain-openai` against dspark-serve: `ChatOpenAI` with a custom base URL, invoked and streamed.

    pip install langchain-openai
    python clients/langchain_openai_example.py --prompt "What is the capital of France?"

OPENAI_BASE_URL / OPENAI_API_KEY choose the server, as for the plain SDK. HTTP only.
"""

from __future__ import annotations

import argparse
import os

from langchain_openai import ChatOpenAI

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


def make_llm(max_tokens: int) -> ChatOpenAI:
    """A greedy ChatOpenAI bound to the local server (`model="default"` is the served model's alias)."""
    return ChatOpenAI(model="default", base_url=os.environ.get("OPENAI_BASE_URL", DEFAULT_BASE_URL),
                      api_key=os.environ.get("OPENAI_API_KEY", "unused"), temperature=0,
                      max_tokens=max_tokens, max_retries=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default="What is the capital of France?")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    llm = make_llm(args.max_tokens)
    reply = llm.invoke([("user", args.prompt)])
    print(f"invoke> {reply.content}")
    print(f"usage> {reply.usage_metadata}")
    print(f"stream> {''.join(chunk.content for chunk in llm.stream([('user', args.prompt)]))}")


if __name__ == "__main__":
    main()
