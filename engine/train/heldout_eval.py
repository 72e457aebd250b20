"""Held-out report of a saved drafter: the numbers a drafter's model card states.

* `acceptance_by_cap`: greedy tau (tokens committed per round) and conditional acceptance per draft
  position, at each fixed cap, from real rounds through `SpecDecoder`.
* `calibration`: ECE of the confidence head's prefix survival per position, before and after the
  STS temperatures stored in the drafter's config (docs/method.md §3.3). Run it on prompts other than those
  STS was fitted on, or the "after" figure is in-sample.
* `context_ablation`: greedy tau at one cap with the drafter's target context replaced by zero rows.
  A drafter that reads the target's hidden states loses much of its acceptance on a blank context;
  one that mostly learned token statistics loses little.
* `paired_speed`: end-to-end greedy speed of a speculative runtime over a baseline runtime on the
  same prompts, interleaved per prompt (A B, then B A) so machine drift cancels; the ratio of each
  prompt is its own, and the summary is their median with min and max.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from engine.train.evaluate import speculative_rounds, zeroed_context
from engine.train.sts import Rounds, ece_by_position


def acceptance_by_cap(target, drafter, prompts: list[list[int]], max_tokens: int, caps: list[int], *,
                      stop_ids: frozenset[int] = frozenset()) -> list[dict]:
    """Per cap: greedy tau, acceptance by position, rounds and tokens over all ``prompts``."""
    out = []
    for cap in caps:
        stats, _ = speculative_rounds(target, drafter, prompts, max_tokens, stop_ids=stop_ids, cap=cap)
        out.append({"cap": stats.cap, "tau": round(stats.mean_accepted_length, 4),
                    "acceptance_by_position": [round(a, 4) for a in stats.acceptance_by_position],
                    "rounds": stats.rounds, "generated_tokens": stats.generated_tokens})
    return out


def context_ablation(target, drafter, prompts: list[list[int]], max_tokens: int, cap: int, *,
                     stop_ids: frozenset[int] = frozenset(), with_context: dict | None = None) -> dict:
    """Greedy tau and acceptance at ``cap`` with the real context and with zeroed context taps.

    ``context_gain`` is the difference of the two taus. ``with_context`` may pass the real-context
    row of `acceptance_by_cap` at this cap, already measured on the same prompts. The verifier
    still decides every token, so both passes stay lossless; only the drafts change.
    """
    real = with_context
    if real is not None and real["cap"] != min(cap, drafter.config.max_drafts):
        raise ValueError(f"with_context was measured at cap {real['cap']}, not {cap}")
    if real is None:
        (real,) = acceptance_by_cap(target, drafter, prompts, max_tokens, [cap], stop_ids=stop_ids)
    with zeroed_context(drafter):
        (blind,) = acceptance_by_cap(target, drafter, prompts, max_tokens, [cap], stop_ids=stop_ids)
    return {"cap": real["cap"], "tau": real["tau"], "tau_zero_context": blind["tau"],
            "context_gain": round(real["tau"] - blind["tau"], 4),
            "acceptance_by_position": real["acceptance_by_position"],
            "acceptance_by_position_zero_context": blind["acceptance_by_position"]}


def calibration(target, drafter, prompts: list[list[int]], max_tokens: int, *,
                stop_ids: frozenset[int] = frozenset(), sampling_temperature: float = 0.0) -> dict:
    """ECE per position of prod_{i<=k} sigmoid(z_i / t_i) against "drafts 1..k accepted".

    "before" uses t = 1, "after" the drafter's stored STS temperatures t_k.
    """
    if not drafter.has_confidence:
        return {}
    k = drafter.config.max_drafts
    temps = np.array(drafter.config.sts_temperatures or [1.0] * k, dtype=np.float64)  # [K]
    _, rounds = speculative_rounds(target, drafter, prompts, max_tokens, stop_ids=stop_ids,
                                   temperature=sampling_temperature)
    recorded = Rounds.from_lists(rounds, k)
    # The decoder reports sigmoid(z_k / t_k), so the recorded logits are z_k / t_k: undo the scaling.
    raw = Rounds(recorded.z * temps[None, :], recorded.accepted, recorded.group)
    samples = [int((~np.isnan(raw.z[:, j])).sum()) for j in range(k)]
    return {"rounds": len(rounds), "samples_by_position": samples, "temperatures": temps.tolist(),
            "ece_before": _rounded(ece_by_position(raw, [1.0] * k)),
            "ece_after": _rounded(ece_by_position(raw, temps))}


def paired_speed(spec_runtime, base_runtime, prompts: list[list[int]], max_tokens: int,
                 progress=None) -> dict:
    """Greedy end-to-end speed ratio spec / baseline per prompt (interleaved), and its median."""
    rows = []
    for i, prompt in enumerate(prompts):
        order = [(base_runtime, "baseline"), (spec_runtime, "spec")]
        runs = {name: _timed(rt, prompt, max_tokens) for rt, name in (order if i % 2 == 0 else order[::-1])}
        base, spec = runs["baseline"], runs["spec"]
        rows.append({"prompt": i, "tokens": spec["tokens"], "same_output": spec["ids"] == base["ids"],
                     "baseline_tok_s": base["tok_s"], "spec_tok_s": spec["tok_s"],
                     "ratio": round(spec["tok_s"] / base["tok_s"], 4), "tau": spec["tau"], "cap": spec["cap"],
                     "spec_time_s": spec["times"], "baseline_time_s": base["times"]})
        if progress:
            progress(f"speed prompt {i + 1}/{len(prompts)}: x{rows[-1]['ratio']:.2f} (tau {spec['tau']:.2f})")
    ratios = [r["ratio"] for r in rows]
    return {"prompts": rows, "median_ratio": round(statistics.median(ratios), 4), "min_ratio": min(ratios),
            "max_ratio": max(ratios), "all_outputs_identical": all(r["same_output"] for r in rows),
            "median_tau": round(statistics.median(r["tau"] for r in rows), 4)}


def _timed(runtime, prompt: list[int], max_tokens: int) -> dict:
    # One greedy request through the engine's request loop (what serving runs), wall-timed.
    from engine.api import GenerationRequest, SamplingParams
    from engine.generate import generate

    t0 = time.perf_counter()
    ids, _, result = generate(runtime, GenerationRequest("timed", tuple(prompt), max_tokens, SamplingParams()))
    wall = time.perf_counter() - t0
    s = result.stats
    times = {"prefill": round(s.time_prefill_s, 4), "draft": round(s.time_draft_s, 4),
             "verify": round(s.time_verify_s, 4), "accept": round(s.time_accept_s, 4),
             "other": round(s.time_other_s, 4), "wall": round(wall, 4)}
    return {"ids": ids, "tokens": len(ids), "tok_s": len(ids) / wall, "tau": s.mean_accepted_length,
            "cap": s.cap, "times": times}


def _rounded(values: list[float]) -> list[float | None]:
    return [None if np.isnan(v) else round(float(v), 4) for v in values]
