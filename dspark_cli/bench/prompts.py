"""The benchmark's fixed, versioned prompt sets, shipped in the repo.

`data/bench/prompts-v1.jsonl` holds records {"id", "kind", "messages"} taken from the drafters'
held-out prompt files, so no prompt was seen in drafter training. A changed file is a new version:
the report carries the file name and its sha256 so results are compared on the same prompts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "data" / "bench" / "prompts-v1.jsonl"
# The copy-heavy workloads (code edits, quoting, rewrites, revisions, open chat) of issue 24, built
# by scripts/make_bench_workloads.py from stdlib sources and Python docs.
DEFAULT_WORKLOADS = DEFAULT_PROMPTS.with_name("workloads-v1.jsonl")
# Questions answered in JSON under a schema each (`dspark bench --structured`): records also hold "schema".
DEFAULT_STRUCTURED = DEFAULT_PROMPTS.with_name("structured-v1.jsonl")


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt: a chat conversation ending in a user turn."""

    id: str
    kind: str
    messages: tuple[dict, ...]
    schema: dict | None = None  # the JSON schema the answer must match (structured-output sets)


def load_prompts(path: Path = DEFAULT_PROMPTS, per_kind: int | None = None) -> tuple[list[BenchPrompt], dict]:
    """The first `per_kind` prompts of each kind (all when None), kinds interleaved; plus set metadata."""
    raw = path.read_bytes()
    records = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    by_kind: dict[str, list[BenchPrompt]] = {}
    for r in records:
        by_kind.setdefault(r["kind"], []).append(BenchPrompt(r["id"], r["kind"], tuple(r["messages"]), r.get("schema")))
    chosen = [p[:per_kind] if per_kind else p for p in by_kind.values()]
    # Interleave kinds (chat-1, code-1, docs-1, chat-2, ...) so a partial run still covers all kinds.
    ordered = [group[i] for i in range(max(map(len, chosen), default=0)) for group in chosen if i < len(group)]
    meta = {"file": path.name, "sha256": hashlib.sha256(raw).hexdigest(), "count": len(ordered),
            "kinds": sorted(by_kind)}
    return ordered, meta
