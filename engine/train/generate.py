"""Target-generated continuations of prompts, batched through mlx-lm's `BatchGenerator`.

Training on the target's own outputs aligns the drafter with what it will be asked to predict
(DeepSpec regenerates every response with the target, docs/method.md §8). Generation runs many prompts
together with one batched KV cache, and is resumable: each finished group of prompts is appended
to a JSONL file, and a restart skips the prompts already there.

Call this with the plain mlx-lm model, before a `Target` wraps its layers with taps (the taps
would otherwise record every decode step).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

log = logging.getLogger(__name__)

ProgressFn = Callable[[str], None]


def generate_batch(model: nn.Module, prompts: list[list[int]], max_tokens: int, *, temperature: float = 0.0,
                   top_p: float = 1.0, stop_ids: frozenset[int] = frozenset(), batch: int = 16) -> list[list[int]]:
    """Continuations of ``prompts`` (at most ``max_tokens`` each; a stop id is kept and ends it)."""
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    gen = BatchGenerator(model, stop_tokens=[[t] for t in sorted(stop_ids)],
                         sampler=make_sampler(temp=temperature, top_p=top_p),
                         completion_batch_size=batch, prefill_batch_size=min(batch, 8))
    try:
        uids = gen.insert([list(p) for p in prompts], [max_tokens] * len(prompts))
        out: dict[int, list[int]] = {uid: [] for uid in uids}
        while responses := gen.next_generated():
            for r in responses:
                out[r.uid].append(int(r.token))
    finally:
        gen.close()
    return [out[uid] for uid in uids]


def generate_continuations(model: nn.Module, prompts: list[list[int]], max_tokens: int, cache_file: Path, *,
                           temperature: float = 0.0, top_p: float = 1.0, stop_ids: frozenset[int] = frozenset(),
                           batch: int = 16, seed: int = 0, progress: ProgressFn | None = None) -> list[list[int]]:
    """Continuations for every prompt, resumable through ``cache_file`` (JSONL {"index", "answer"})."""
    done = _read_done(cache_file)
    todo = [i for i in range(len(prompts)) if i not in done]
    for start in range(0, len(todo), batch):
        group = todo[start : start + batch]
        mx.random.seed(seed * 1_000_003 + group[0])  # seeded per group: a restart redraws the same text
        answers = generate_batch(model, [prompts[i] for i in group], max_tokens, temperature=temperature,
                                 top_p=top_p, stop_ids=stop_ids, batch=batch)
        with cache_file.open("a") as fh:
            for i, answer in zip(group, answers):
                fh.write(json.dumps({"index": i, "answer": answer}) + "\n")
                done[i] = answer
        if progress:
            progress(f"generated continuations {len(done)}/{len(prompts)}")
    return [done[i] for i in range(len(prompts))]


def _read_done(cache_file: Path) -> dict[int, list[int]]:
    done: dict[int, list[int]] = {}
    if not cache_file.exists():
        return done
    for line in cache_file.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by an interruption: regenerate that prompt
        done[int(row["index"])] = [int(t) for t in row["answer"]]
    return done
