"""Engine `TokenLogprob`s -> the `logprobs` objects of the chat and the text completion APIs.

The values are the target model's raw log-softmax (before penalties, bias, temperature, top-k and
top-p), taken from the rows the verify pass computed (see `engine.api.TokenLogprob`).
"""

from __future__ import annotations

from typing import Any

from engine.api import TokenLogprob


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat_content(items: list[TokenLogprob]) -> list[dict[str, Any]]:
    """Chat `logprobs.content` entries: token, logprob, bytes and `top_logprobs`."""
    return [
        {**_entry(t.token, t.logprob), "top_logprobs": [_entry(tok, lp) for _, tok, lp in t.top]}
        for t in items
    ]


def chat_logprobs(items: list[TokenLogprob]) -> dict[str, Any]:
    """The chat choice's `logprobs` object."""
    return {"content": chat_content(items), "refusal": None}


def completion_logprobs(items: list[TokenLogprob], offset: int) -> dict[str, Any]:
    """The text completion `logprobs` object; `offset` is the text length before these tokens."""
    offsets = []
    for t in items:
        offsets.append(offset)
        offset += len(t.token)
    return {
        "tokens": [t.token for t in items],
        "token_logprobs": [t.logprob for t in items],
        "top_logprobs": [{tok: lp for _, tok, lp in t.top} for t in items],
        "text_offset": offsets,
    }
