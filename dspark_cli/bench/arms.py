"""Benchmark arms: one way of decoding a prompt (a mode at a cap, or mlx-lm), and one timed run of it.

Every engine arm goes through `engine.generate.stream_generate`, the request loop the server runs, so
the numbers include detokenization and stop handling. Fixed-cap arms are variants of one loaded
runtime per mode (same target and drafter objects); `auto` is the runtime as built.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

BASELINE, MLX_LM = "baseline", "mlx-lm"


class GrammarPrompt(list):
    """Prompt token ids that engine arms decode under a JSON schema (`dspark bench --structured`).

    A list, so every part of the bench that counts or passes prompt ids takes it unchanged."""

    def __init__(self, ids: list[int], schema: dict):
        super().__init__(ids)
        self.schema = schema

    def grammar(self):
        """The engine's GrammarSpec for the schema."""
        import json

        from engine.api import GrammarSpec

        return GrammarSpec("json_schema", json.dumps(self.schema))


@dataclass
class Arm:
    """A named decoding configuration. `runtime` is an engine Runtime, or (model, tokenizer) for mlx-lm."""

    name: str  # "baseline", "dspark@3", "dspark@auto", "mlx-lm"
    mode: str  # baseline | dspark | dflash | mlx-lm
    cap: int | str | None  # fixed cap, "auto", or None (no drafter)
    runtime: object

    def run(self, prompt_ids: list[int], max_tokens: int) -> dict:
        """Decode `prompt_ids` greedily; the run's measurements (see `_engine_run`)."""
        if self.mode == MLX_LM:
            return _mlx_lm_run(*self.runtime, prompt_ids, max_tokens)
        return _engine_run(self.runtime, prompt_ids, max_tokens)


def with_cap(runtime, cap: int):
    """The same loaded runtime decoding with a fixed draft cap (shares target, drafter, tokenizer)."""
    return replace(runtime, spec=replace(runtime.spec, max_draft=cap, confidence_threshold=None), cap=cap,
                   info=replace(runtime.info, cap=cap))


def build_arms(baseline, spec_runtimes: dict, caps_for, mlx_lm: bool) -> list[Arm]:
    """baseline, then per mode its fixed caps and auto (when its runtime has a cost curve), then mlx-lm."""
    arms = [Arm(BASELINE, BASELINE, None, baseline)]
    for mode, runtime in spec_runtimes.items():
        for cap in caps_for(runtime.drafter.config.max_drafts):
            arms.append(Arm(f"{mode}@{cap}", mode, cap, with_cap(runtime, cap)))
        if runtime.curve is not None:
            arms.append(Arm(f"{mode}@auto", mode, "auto", runtime))
    if mlx_lm:
        # The baseline runtime's model has no tap hooks installed: mlx-lm runs the model as loaded.
        arms.append(Arm(MLX_LM, MLX_LM, None, (baseline.target.model, baseline.tokenizer)))
    return arms


def timed_greedy(runtime, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], object, float]:
    """One greedy request through the engine's request loop on this thread: (ids, Finished, wall seconds);
    a `GrammarPrompt` is decoded under its schema."""
    from engine.api import GenerationRequest, SamplingParams
    from engine.generate import generate

    grammar = prompt_ids.grammar() if isinstance(prompt_ids, GrammarPrompt) else None
    request = GenerationRequest("timed", tuple(prompt_ids), max_tokens, SamplingParams(temperature=0.0),
                                grammar=grammar)
    t0 = time.perf_counter()
    ids, _, finished = generate(runtime, request)
    return ids, finished, time.perf_counter() - t0


def _engine_run(runtime, prompt_ids: list[int], max_tokens: int) -> dict:
    ids, result, wall = timed_greedy(runtime, prompt_ids, max_tokens)
    s = result.stats
    return {
        "ids": [t for t in ids if t not in runtime.eos_ids], "tokens": len(ids), "wall_s": wall,
        "prefill_s": s.time_prefill_s, "decode_s": s.decode_time_s, "decode_tokens": s.round_tokens,
        "rounds": s.rounds, "drafted": s.drafted_tokens, "accepted": s.accepted_tokens,
        "accepted_by_position": list(s.accepted_by_position), "verified_by_position": list(s.verified_by_position),
        "time_s": {"draft": s.time_draft_s, "verify": s.time_verify_s, "accept": s.time_accept_s,
                   "other": s.time_other_s},
        "by_kind": {kind: dict(vars(k)) for kind, k in s.by_kind.items()},
        "grammar_masks": s.grammar_masks, "grammar_s": s.time_grammar_s,
    }


def _mlx_lm_run(model, tokenizer, prompt_ids: list[int], max_tokens: int) -> dict:
    # mlx-lm's own loop (async eval pipelining included), greedy by default.
    from mlx_lm.generate import stream_generate

    ids: list[int] = []
    t0 = time.perf_counter()
    first, generated = None, 0
    for response in stream_generate(model, tokenizer, list(prompt_ids), max_tokens=max_tokens):
        first, generated = first or time.perf_counter(), response.generation_tokens
        # A "stop" response carries the EOS mlx-lm broke on; every other one a generated token.
        if response.finish_reason != "stop":
            ids.append(response.token)
    wall = time.perf_counter() - t0
    prefill = (first or t0 + wall) - t0
    eos = set(getattr(tokenizer, "eos_token_ids", ()) or ())
    # `generated` counts a final EOS too, as the engine's token count does.
    return {"ids": [t for t in ids if t not in eos], "tokens": generated, "wall_s": wall, "prefill_s": prefill,
            "decode_s": wall - prefill, "decode_tokens": max(0, generated - 1), "rounds": max(0, generated - 1)}
