"""Multi-turn conversations: N conversations of K turns sharing one long system prompt, each turn
resending the whole history (as chat clients and agents do), with TTFT and cached prompt tokens per turn.

Conversations run one after another (one request in flight), so each turn's TTFT is its own prefill
and not queueing. A server with a prefix cache answers later turns, and first turns after the first
conversation (the shared system prompt), sooner; `usage.prompt_tokens_details.cached_tokens` says
how much of each prompt it reused, when the server reports it.
"""

from __future__ import annotations

import time

from loadtest.request import RequestResult, chat_body, stream_chat
from loadtest.stats import percentile
from loadtest.sweep import LoadConfig, make_client

FOLLOW_UPS = ("Can you say more about that?", "Give a short example.", "Summarize your answer in one line.",
              "What is a common mistake here?")
_PARAGRAPH = ("You are a careful assistant for a software team. Read the whole conversation before you answer. "
              "Prefer short, correct answers; say when you are unsure; quote code exactly; never invent an API. ")


def system_prompt(words: int) -> str:
    """A deterministic system prompt of about `words` words (numbered rules, like an agent's)."""
    base = _PARAGRAPH.split()
    rules, n = [], 0
    while n < words:
        rules.append(f"Rule {len(rules) + 1}: " + " ".join(base))
        n += len(base) + 2
    return "\n".join(rules)


async def run_conversations(cfg: LoadConfig, conversations: int, turns: int, system: str) -> list[list[RequestResult]]:
    """Each conversation's turn results; a failed turn ends its conversation (its history would be wrong)."""
    out: list[list[RequestResult]] = []
    deadline = time.monotonic() + cfg.time_limit_s
    async with make_client(cfg, 1) as client:
        for c in range(conversations):
            question = cfg.prompts[c % len(cfg.prompts)][-1]["content"]
            messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
            results: list[RequestResult] = []
            for turn in range(turns):
                if time.monotonic() >= deadline:
                    results.append(RequestResult(None, error="time limit reached"))
                    break
                result = await stream_chat(client, chat_body(cfg.model, messages, cfg.max_tokens))
                results.append(result)
                if not result.ok:
                    break
                messages = messages + [{"role": "assistant", "content": result.text},
                                       {"role": "user", "content": FOLLOW_UPS[turn % len(FOLLOW_UPS)]}]
            out.append(results)
    return out


def summarize_turns(conversations: list[list[RequestResult]], turns: int) -> list[dict]:
    """Per turn index: requests, errors, TTFT p50/p95 (ms), prompt and cached tokens (p50), and the
    TTFT p50 of turn 1 over this turn's."""
    rows = []
    for k in range(turns):
        results = [conv[k] for conv in conversations if len(conv) > k]
        ok = [r for r in results if r.ok]
        ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
        prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
        cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
        fractions = [r.cached_tokens / r.prompt_tokens for r in ok if r.cached_tokens is not None and r.prompt_tokens]
        rows.append({"turn": k + 1, "requests": len(results), "errors": len(results) - len(ok),
                     "ttft_ms": {"p50": _round(percentile(ttft, 50)), "p95": _round(percentile(ttft, 95))},
                     "prompt_tokens_p50": percentile(prompt, 50), "cached_tokens_p50": percentile(cached, 50),
                     "cached_fraction_p50": _round(percentile(fractions, 50), 3),
                     "error_samples": sorted({r.error or f"HTTP {r.status}" for r in results if not r.ok})[:3]})
    first = rows[0]["ttft_ms"]["p50"] if rows else None
    for row in rows:
        p50 = row["ttft_ms"]["p50"]
        row["turn1_over_this_ttft"] = _round(first / p50, 2) if first and p50 else None
    return rows


def _round(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(x, digits)
