"""A concurrency sweep: at each level, C workers share N requests; bounded in requests and time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from loadtest.request import RequestResult, chat_body, stream_chat


@dataclass(frozen=True)
class LoadConfig:
    """What one sweep sends. `time_limit_s` bounds each level; unfinished requests count as errors."""

    base_url: str
    model: str
    prompts: tuple[tuple[dict, ...], ...]  # chat message lists, used round-robin
    max_tokens: int = 64
    requests: int = 8  # per concurrency level
    api_key: str | None = None
    request_timeout_s: float = 120.0
    time_limit_s: float = 300.0


def make_client(cfg: LoadConfig, concurrency: int) -> httpx.AsyncClient:
    """An HTTP client with one connection per worker and the bearer token, if any."""
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(base_url=cfg.base_url.rstrip("/") + "/", headers=headers, limits=limits,
                             timeout=httpx.Timeout(cfg.request_timeout_s, connect=10.0))


async def run_level(cfg: LoadConfig, concurrency: int, on_done: Callable[[RequestResult], None] = lambda r: None
                    ) -> tuple[list[RequestResult], float]:
    """Send cfg.requests requests with `concurrency` in flight; (results, wall seconds of the level)."""
    results: list[RequestResult] = []
    next_index = iter(range(cfg.requests))
    deadline = time.monotonic() + cfg.time_limit_s

    async def worker(client: httpx.AsyncClient) -> None:
        for i in next_index:  # a shared iterator: each index is taken by exactly one worker
            if time.monotonic() >= deadline:
                return
            body = chat_body(cfg.model, list(cfg.prompts[i % len(cfg.prompts)]), cfg.max_tokens)
            result = await stream_chat(client, body)
            results.append(result)
            on_done(result)

    t0 = time.perf_counter()
    async with make_client(cfg, concurrency) as client:
        tasks = [asyncio.create_task(worker(client)) for _ in range(concurrency)]
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    wall = time.perf_counter() - t0
    # Requests cut off by the time limit are errors, not silently dropped.
    results += [RequestResult(None, error="time limit reached") for _ in range(len(pending))]
    return results, wall


class ServerNotReady(RuntimeError):
    """The server did not list its models: refused, not ready in time, or not an OpenAI server."""


async def wait_for_models(client: httpx.AsyncClient, timeout_s: float, on_wait: Callable[[str], None] = lambda why: None,
                          poll_s: float = 1.0) -> list[str]:
    """GET /models until it answers 200; the listed model ids.

    A 503 (dspark still loading its model) or a refused connection (server still starting) is
    waited out for up to ``timeout_s``, calling ``on_wait(reason)`` before each retry; any other
    status (401 without --api-key, 404 on a wrong base URL) fails at once with `ServerNotReady`.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            response = await client.get("models")
        except httpx.TransportError as exc:
            why = f"{type(exc).__name__}: {exc}".rstrip(": ")
        else:
            if response.status_code == 200:
                return [m["id"] for m in response.json().get("data", [])]
            if response.status_code != 503:
                raise ServerNotReady(f"GET {response.request.url} answered {response.status_code}: "
                                     f"{response.text[:300]}")
            why = "503, still loading"
        if time.monotonic() + poll_s > deadline:
            raise ServerNotReady(f"the server was not ready after {timeout_s:g} s ({why})")
        on_wait(why)
        await asyncio.sleep(poll_s)
