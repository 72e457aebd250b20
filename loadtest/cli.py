"""`python -m loadtest`: sweep concurrency levels against an OpenAI-compatible base URL, write a report."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import ipaddress
import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

from loadtest import multiturn, report
from loadtest.stats import summarize_level
from loadtest.sweep import LoadConfig, ServerNotReady, make_client, run_level, wait_for_models

MAX_REQUESTS = 10_000  # per level: a load test, not a flood
DEFAULT_PROMPTS = Path(__file__).resolve().parents[1] / "data" / "bench" / "prompts-v1.jsonl"
FALLBACK_PROMPTS = ("What is the capital of France?", "Write a Python function that reverses a string.",
                    "Explain what a hash table is in two sentences.")


def build_parser() -> argparse.ArgumentParser:
    """The loadtest argument parser."""
    p = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__)
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="OpenAI base URL (default: local dspark)")
    p.add_argument("--api-key", default=None, help="bearer token, if the server requires one")
    p.add_argument("--model", default=None, help="model id (default: the first one /models lists)")
    p.add_argument("--concurrency", default="1,2,4", help="comma-separated concurrency levels (default: 1,2,4)")
    p.add_argument("--requests", type=int, default=8, help=f"requests per level (at most {MAX_REQUESTS})")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens of each request (default: 64)")
    p.add_argument("--prompts", type=Path, default=None,
                   help="JSONL of {\"messages\": [...]} records used round-robin (default: the bench prompt set)")
    p.add_argument("--time-limit", type=float, default=300.0, help="seconds per level; the rest count as errors")
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--ready-timeout", type=float, default=300.0,
                   help="seconds to wait for a server that is still starting or loading its model (default: 300)")
    p.add_argument("--allow-remote", action="store_true", help="allow a base URL that is not on this machine")
    p.add_argument("--out", type=Path, default=Path("load-report"), help="output directory (default: load-report)")
    p.add_argument("--multi-turn", type=_pair, metavar="N,K", default=None,
                   help="instead of the sweep: N conversations of K turns, one request at a time, sharing a long "
                        "system prompt; reports TTFT and cached prompt tokens per turn (multiturn.json / .md)")
    p.add_argument("--system-words", type=int, default=1100,
                   help="words of the shared system prompt of --multi-turn (default: 1100, about 1,500 tokens)")
    return p


def _pair(text: str) -> tuple[int, int]:
    try:
        n, k = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected N,K (conversations,turns)") from None
    if n < 1 or k < 1:
        raise argparse.ArgumentTypeError("expected N,K >= 1")
    return n, k


def is_loopback(url: str) -> bool:
    """Whether the URL's host is this machine (localhost or a loopback address)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_prompts(path: Path | None) -> tuple[tuple[dict, ...], ...]:
    """Chat message lists from a JSONL file, else the bench prompt set, else three built-in prompts."""
    path = path or (DEFAULT_PROMPTS if DEFAULT_PROMPTS.exists() else None)
    if path is None:
        return tuple(({"role": "user", "content": text},) for text in FALLBACK_PROMPTS)
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return tuple(tuple(r["messages"]) for r in records)


async def sweep(cfg: LoadConfig, levels: list[int]) -> list[dict]:
    """Run each level in turn; their summaries."""
    out = []
    for c in levels:
        results, wall = await run_level(cfg, c)
        out.append(summarize_level(c, results, wall))
        lv = out[-1]
        print(f"concurrency {c}: {lv['ok']}/{lv['requests']} ok, {lv['rejected_429']} x 429, {lv['errors']} errors, "
              f"TTFT p50 {lv['ttft_ms']['p50']} ms, {lv['throughput_tok_s']} tok/s", file=sys.stderr, flush=True)
    return out


async def _ready_models(cfg: LoadConfig, timeout_s: float) -> list[str]:
    """Wait (with one message) until the server lists its models, so no request meets a loading server."""
    said = []

    def waiting(why: str) -> None:
        if not said:
            print(f"loadtest: waiting for {cfg.base_url} ({why}) ...", file=sys.stderr, flush=True)
            said.append(why)

    async with make_client(cfg, 1) as client:
        return await wait_for_models(client, timeout_s, waiting)


def _check(args) -> str | None:
    if not is_loopback(args.base_url) and not args.allow_remote:
        return f"{args.base_url} is not a loopback address; pass --allow-remote to load-test another machine"
    if not 1 <= args.requests <= MAX_REQUESTS:
        return f"--requests must be between 1 and {MAX_REQUESTS}"
    return None


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run the sweep, write load.json / load.md / load.png; exit 1 on any non-429 error."""
    args = build_parser().parse_args(argv)
    problem = _check(args)
    if problem:
        print(f"loadtest: {problem}", file=sys.stderr)
        return 2
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    cfg = LoadConfig(base_url=args.base_url, model=args.model or "", prompts=load_prompts(args.prompts),
                     max_tokens=args.max_tokens, requests=args.requests, api_key=args.api_key,
                     request_timeout_s=args.request_timeout, time_limit_s=args.time_limit)
    try:
        models = asyncio.run(_ready_models(cfg, args.ready_timeout))
    except ServerNotReady as exc:
        print(f"loadtest: {exc}", file=sys.stderr)
        return 2
    if not cfg.model and not models:
        print("loadtest: the server lists no models; pass --model", file=sys.stderr)
        return 2
    cfg = LoadConfig(**{**cfg.__dict__, "model": cfg.model or models[0]})
    if args.multi_turn:
        return _multi_turn(cfg, args, argv)
    rep = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": " ".join(["python -m loadtest", *(argv if argv is not None else sys.argv[1:])]),
           "base_url": cfg.base_url, "model": cfg.model, "max_tokens": cfg.max_tokens, "requests": cfg.requests,
           "levels": asyncio.run(sweep(cfg, levels))}
    args.out.mkdir(parents=True, exist_ok=True)
    rep["plot"] = report.write_plot(rep, args.out)
    report.write_json(rep, args.out)
    print(report.write_markdown(rep, args.out).read_text())
    return 1 if any(lv["errors"] for lv in rep["levels"]) else 0


def _multi_turn(cfg: LoadConfig, args, argv: list[str] | None) -> int:
    """Run --multi-turn and write multiturn.json / multiturn.md; exit 1 on any failed turn."""
    n, k = args.multi_turn
    conversations = asyncio.run(multiturn.run_conversations(cfg, n, k, multiturn.system_prompt(args.system_words)))
    rep = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": " ".join(["python -m loadtest", *(argv if argv is not None else sys.argv[1:])]),
           "base_url": cfg.base_url, "model": cfg.model, "max_tokens": cfg.max_tokens, "conversations": n,
           "turns": k, "system_words": args.system_words, "per_turn": multiturn.summarize_turns(conversations, k)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "multiturn.json").write_text(json.dumps(rep, indent=1) + "\n")
    print(report.write_multiturn_markdown(rep, args.out).read_text())
    return 1 if any(row["errors"] for row in rep["per_turn"]) else 0
