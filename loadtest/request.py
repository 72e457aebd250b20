"""One streamed chat completion, timed from the client's side.

Times: TTFT = first non-empty content delta; end = `[DONE]` (or the stream's close). The token count
is the server's `usage.completion_tokens` (asked for with `stream_options.include_usage`), falling
back to the number of content chunks for servers that ignore it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class RequestResult:
    """Outcome and timings of one request (seconds; None where it does not apply)."""

    status: int | None  # HTTP status; None: no response (connection error, timeout)
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    tokens: int = 0
    decode_s: float | None = None  # first to last content delta
    chunks: int = 0
    spec_stats: dict | None = None  # the server's speculative statistics (dspark_stats), when sent
    text: str = ""  # the streamed content, concatenated
    prompt_tokens: int | None = None  # from the usage chunk, when sent
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when sent
    chunk_gaps_s: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Finished with a complete stream."""
        return self.status == 200 and self.error is None

    @property
    def itl_s(self) -> float | None:
        """Mean inter-token latency of the request (decode time per token after the first)."""
        return self.decode_s / (self.tokens - 1) if self.decode_s is not None and self.tokens > 1 else None


def chat_body(model: str, messages: list[dict], max_tokens: int) -> dict:
    """A greedy streamed chat request that asks for usage on the final chunk."""
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}


async def stream_chat(client: httpx.AsyncClient, body: dict) -> RequestResult:
    """POST /chat/completions with streaming and time it; never raises for HTTP or network errors."""
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", "chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return RequestResult(response.status_code, error=_error_text(response))
            result = RequestResult(200)
            await _read_events(response, result, t0)
            return result
    except httpx.HTTPError as exc:
        return RequestResult(None, error=f"{type(exc).__name__}: {exc}")


async def _read_events(response: httpx.Response, result: RequestResult, t0: float) -> None:
    first = last = None
    done = False
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # SSE comments (keep-alive, queue position) and blank separators
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        now = time.perf_counter()
        chunk = json.loads(data)
        if "error" in chunk:
            result.error = str(chunk["error"].get("message", chunk["error"]))
            break
        if _content(chunk):
            result.text += _content(chunk)
            result.chunks += 1
            if last is not None:
                result.chunk_gaps_s.append(now - last)
            first, last = first or now, now
        result.spec_stats = chunk.get("dspark_stats") or result.spec_stats
        if chunk.get("usage"):
            _read_usage(chunk["usage"], result)
    result.e2e_s = time.perf_counter() - t0
    if not done and result.error is None:
        result.error = "stream ended without [DONE]"
    result.tokens = result.tokens or result.chunks
    if first is not None:
        result.ttft_s, result.decode_s = first - t0, last - first


def _read_usage(usage: dict, result: RequestResult) -> None:
    result.tokens = int(usage.get("completion_tokens", 0))
    result.prompt_tokens = usage.get("prompt_tokens")
    result.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


def _content(chunk: dict) -> str:
    choices = chunk.get("choices") or []
    return (choices[0].get("delta") or {}).get("content") or "" if choices else ""


def _error_text(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]
