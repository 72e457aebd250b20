"""loadtest: SSE timing and error handling on scripted streams, bounds, and a sweep against a real
`dspark serve` (started here, baseline mode, queue of 1) that must show deliberate 429s, no other
errors, and TTFT growing with queueing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest

from loadtest.cli import is_loopback, main
from loadtest.request import stream_chat
from loadtest.stats import percentile, summarize_level
from loadtest.sweep import ServerNotReady, wait_for_models
from tests.real_server import ServeProcess, clean_env
from tests.server.conftest import free_port


def _sse(*frames: str) -> bytes:
    return "".join(f"data: {f}\n\n" for f in frames).encode()


def _run(body: bytes, status: int = 200):
    transport = httpx.MockTransport(lambda request: httpx.Response(status, content=body))

    async def go():
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1/v1/") as client:
            return await stream_chat(client, {"stream": True})

    return asyncio.run(go())


def _chunk(content=None, **extra) -> str:
    delta = {"content": content} if content is not None else {}
    return json.dumps({"choices": [{"delta": delta}], **extra})


def test_stream_timing_usage_and_spec_stats():
    """Content chunks set TTFT and decode time; usage gives the token count; dspark_stats is kept."""
    r = _run(_sse(_chunk(""), _chunk("Hel"), _chunk("lo"), _chunk(None, dspark_stats={"mode": "dspark"}),
                  json.dumps({"choices": [], "usage": {"completion_tokens": 5}}), "[DONE]") + b": keep-alive\n\n")
    assert r.ok and r.chunks == 2 and r.tokens == 5 and r.spec_stats == {"mode": "dspark"}
    assert 0 <= r.ttft_s <= r.e2e_s and r.decode_s >= 0 and r.itl_s == pytest.approx(r.decode_s / 4)


def test_errors_are_counted_not_raised():
    """A 429, an error frame after the stream started, and a stream cut before [DONE] are all errors."""
    assert _run(json.dumps({"error": {"message": "queue full"}}).encode(), status=429).status == 429
    frame = _run(_sse(_chunk("a"), json.dumps({"error": {"message": "boom"}})))
    assert not frame.ok and frame.error == "boom"
    cut = _run(_sse(_chunk("a")))
    assert not cut.ok and "[DONE]" in cut.error
    level = summarize_level(2, [_run(b"{}", status=429), frame, cut], wall_s=1.0)
    assert level["rejected_429"] == 1 and level["errors"] == 2 and level["ok"] == 0


def test_percentiles_and_loopback_default(tmp_path):
    """Linear-interpolated percentiles; a non-loopback URL is refused unless --allow-remote."""
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 95) == 5 and percentile([], 50) is None
    assert percentile(list(range(101)), 95) == 95
    assert is_loopback("http://127.0.0.1:8000/v1") and is_loopback("http://localhost/v1") and is_loopback("http://[::1]/")
    assert not is_loopback("http://10.0.0.1/v1") and not is_loopback("http://example.invalid/v1")
    assert main(["--base-url", "http://10.0.0.1:8000/v1", "--out", str(tmp_path)]) == 2
    assert main(["--requests", "0", "--out", str(tmp_path)]) == 2


@pytest.mark.slow
def _wait(statuses, timeout_s=5.0):
    """wait_for_models against a scripted server answering `statuses` in turn (None = refused)."""
    seen, waits = [], []

    def answer(request):
        status = statuses[min(len(seen), len(statuses) - 1)]
        seen.append(status)
        if status is None:
            raise httpx.ConnectError("connection refused", request=request)
        body = {"data": [{"id": "m1"}, {"id": "m2"}]} if status == 200 else {"error": {"message": "no"}}
        return httpx.Response(status, json=body)

    async def go():
        transport = httpx.MockTransport(answer)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1/v1/") as client:
            return await wait_for_models(client, timeout_s, waits.append, poll_s=0.01)

    return asyncio.run(go()), seen, waits


def test_waits_for_a_loading_server_and_fails_clearly_otherwise():
    """503 (loading) and refused connections are waited out; 401 fails at once; a server that never
    comes up fails after the ready timeout with the last reason."""
    models, seen, waits = _wait([None, 503, 503, 200])
    assert models == ["m1", "m2"] and seen == [None, 503, 503, 200] and len(waits) == 3
    assert "ConnectError" in waits[0] and "loading" in waits[1]
    with pytest.raises(ServerNotReady, match="401"):
        _wait([401])
    with pytest.raises(ServerNotReady, match="not ready after 0.2 s .*loading"):
        _wait([503], timeout_s=0.2)


def test_sweep_against_real_server(default_model_dir, tmp_path):
    """Concurrency 1, 2, 3 on a queue of one: only deliberate 429s, TTFT grows with queueing, a full report."""
    server = ServeProcess(free_port(), "--mode", "baseline", "--max-queue", "1")
    try:
        server.wait_ready()
        out = tmp_path / "load"
        proc = subprocess.run([sys.executable, "-m", "loadtest", "--base-url", f"{server.base_url}/v1",
                               "--concurrency", "1,2,3", "--requests", "4", "--max-tokens", "8", "--out", str(out)],
                              capture_output=True, text=True, timeout=300, env=clean_env())
        multi = subprocess.run([sys.executable, "-m", "loadtest", "--base-url", f"{server.base_url}/v1",
                                "--multi-turn", "2,3", "--system-words", "300", "--max-tokens", "8", "--out", str(out)],
                               capture_output=True, text=True, timeout=300, env=clean_env())
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr + proc.stdout
    rep = json.loads((out / "load.json").read_text())
    by_c = {lv["concurrency"]: lv for lv in rep["levels"]}
    assert set(by_c) == {1, 2, 3} and all(lv["errors"] == 0 for lv in by_c.values())
    assert all(lv["ok"] + lv["rejected_429"] == 4 for lv in by_c.values())
    assert by_c[1]["rejected_429"] == 0 and by_c[3]["rejected_429"] >= 1  # 1 running + 1 queued, the rest refused
    # One request runs at a time, so a queued request's first token waits for a whole generation.
    assert by_c[2]["ttft_ms"]["p95"] > by_c[1]["ttft_ms"]["p50"]
    spec = by_c[1]["server_spec"]
    assert spec["mode"] == "baseline" and spec["client_over_engine_decode_p50"] is not None
    assert (out / "load.png").read_bytes()[:4] == b"\x89PNG" and "| 3 |" in (out / "load.md").read_text()

    # --multi-turn: every later turn (and the second conversation's first turn, which shares the
    # system prompt) restores most of its prompt from the server's prefix cache.
    assert multi.returncode == 0, multi.stderr + multi.stdout
    turns = json.loads((out / "multiturn.json").read_text())["per_turn"]
    assert [row["requests"] for row in turns] == [2, 2, 2] and all(row["errors"] == 0 for row in turns)
    assert all(row["cached_fraction_p50"] >= 0.8 for row in turns[1:])
    assert "| 3 |" in (out / "multiturn.md").read_text()
