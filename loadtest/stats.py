"""Summaries of one concurrency level: latency percentiles, throughput, errors, server statistics."""

from __future__ import annotations

import math
import statistics

from loadtest.request import RequestResult


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between order statistics; None if empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _dist(values: list[float], scale: float = 1000.0) -> dict:
    # Latencies are reported in milliseconds.
    p = {"p50": percentile(values, 50), "p95": percentile(values, 95)}
    return {k: None if v is None else round(v * scale, 2) for k, v in p.items()} | {"n": len(values)}


def engine_decode_tok_s(stats: dict) -> float | None:
    """The server's own decode rate from dspark_stats: tokens after the first / time after prefill."""
    keys = ("time_draft_s", "time_verify_s", "time_accept_s", "time_other_s")
    decode = sum(stats.get(k, 0.0) for k in keys)
    tokens = stats.get("generated_tokens", 0)
    return (tokens - 1) / decode if decode > 0 and tokens > 1 else None


def _spec_summary(ok: list[RequestResult]) -> dict | None:
    with_stats = [r for r in ok if r.spec_stats]
    if not with_stats:
        return None
    s = [r.spec_stats for r in with_stats]
    overhead = [(r.tokens - 1) / r.decode_s / engine_decode_tok_s(r.spec_stats)
                for r in with_stats if r.decode_s and r.tokens > 1 and engine_decode_tok_s(r.spec_stats)]
    return {"mode": s[0].get("mode"), "cap": s[0].get("cap"),
            "mean_accepted_length": round(statistics.mean(x.get("mean_accepted_length", 0.0) for x in s), 4),
            "server_decode_tok_s_p50": round(statistics.median(engine_decode_tok_s(x) or 0.0 for x in s), 2),
            # client-side decode rate / the engine's own for the same request: 1.0 = no HTTP overhead
            "client_over_engine_decode_p50": round(statistics.median(overhead), 4) if overhead else None}


def summarize_level(concurrency: int, results: list[RequestResult], wall_s: float) -> dict:
    """Percentiles (ms), throughput and outcome counts of one level."""
    ok = [r for r in results if r.ok]
    tokens = sum(r.tokens for r in ok)
    decode = [(r.tokens - 1) / r.decode_s for r in ok if r.decode_s and r.tokens > 1]
    errors = [r for r in results if not r.ok and r.status != 429]
    return {
        "concurrency": concurrency, "requests": len(results), "ok": len(ok),
        "rejected_429": sum(r.status == 429 for r in results), "errors": len(errors),
        "error_samples": sorted({f"{r.status}: {r.error}" for r in errors})[:5],
        "wall_s": round(wall_s, 3), "throughput_tok_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "requests_per_s": round(len(ok) / wall_s, 3) if wall_s > 0 else None,
        "ttft_ms": _dist([r.ttft_s for r in ok if r.ttft_s is not None]),
        "itl_ms": _dist([r.itl_s for r in ok if r.itl_s is not None]),
        "e2e_ms": _dist([r.e2e_s for r in ok if r.e2e_s is not None]),
        "stream_decode_tok_s_p50": round(statistics.median(decode), 2) if decode else None,
        "tokens": tokens, "server_spec": _spec_summary(ok),
    }
