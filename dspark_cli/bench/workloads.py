"""Per-workload numbers of a bench run: paired speedup, tau, lookup's match fraction, acceptance,
identity with baseline, and a looping measure that splits each workload's prompts in two.

Why a looping measure: a small model often falls into repeating itself, and a lookup drafter
predicts a loop perfectly (it copies the previous repetition). Such an output gets faster, but that
speed is not value, so speedups are reported on the non-looping and looping prompts separately.

Looping is judged on the baseline's output of a prompt (the reference text, which every lossless arm
reproduces): the share of its 8-token n-grams that already occurred earlier in the same output.
Copying from the prompt does not count, only repetition within the output. A prompt is "looping"
when that share is above LOOP_THRESHOLD.
"""

from __future__ import annotations

import statistics

from dspark_cli.bench.arms import BASELINE
from dspark_cli.bench.summary import decode_tok_s, e2e_tok_s, paired_ratios

LOOP_NGRAM = 8
# An output that repeats a phrase of n tokens k times scores about 1 - 1/k once the phrase is longer
# than 8 tokens; 0.3 means "about a third of the output is repetition of itself". Ordinary code and
# prose rarely repeat an 8-token run at all (a repeated idiom scores a few percent).
LOOP_THRESHOLD = 0.3


def repeated_ngram_share(ids, n: int = LOOP_NGRAM) -> float:
    """Share of the n-grams of `ids` that already occurred earlier in `ids` (0.0 when shorter than n)."""
    seen: set[tuple] = set()
    repeats = total = 0
    for i in range(len(ids) - n + 1):
        gram = tuple(ids[i:i + n])
        repeats += gram in seen
        total += 1
        seen.add(gram)
    return repeats / total if total else 0.0


def is_looping(share: float, threshold: float = LOOP_THRESHOLD) -> bool:
    """Whether an output with this repeated n-gram share counts as looping."""
    return share > threshold


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def cpu_tok_s(run: dict) -> float:
    """Tokens per CPU second of the server process (0.0 when not measured, which drops the pair)."""
    cpu = run.get("cpu_s")
    return run["tokens"] / cpu if cpu else 0.0


def prompt_speedups(records: list[dict], arm: str, speed=e2e_tok_s) -> dict[str, float]:
    """Per prompt: the median of its paired ratios speed(arm) / speed(baseline) (one per pass)."""
    by_prompt: dict[str, list[float]] = {}
    for pair in paired_ratios(records, arm, BASELINE, speed):
        by_prompt.setdefault(pair["prompt"], []).append(pair["ratio"])
    return {p: statistics.median(r) for p, r in by_prompt.items()}


def loop_shares(records: list[dict]) -> dict[str, float]:
    """Per prompt: the repeated n-gram share of the baseline's output (its first pass)."""
    out: dict[str, float] = {}
    for r in records:
        if r["arm"] == BASELINE and "repeat_share" in r:
            out.setdefault(r["prompt"], r["repeat_share"])
    return out


def _counts(runs: list[dict]) -> dict:
    """Summed round and draft counters of some runs, the lookup kind's matched and empty rounds included."""
    rounds = sum(r["rounds"] for r in runs)
    tokens = sum(r["decode_tokens"] for r in runs)
    drafted = sum(r.get("drafted", 0) for r in runs)
    accepted = sum(r.get("accepted", 0) for r in runs)
    lookup = [r.get("by_kind", {}).get("lookup") for r in runs]
    matched = sum(k["rounds"] for k in lookup if k)
    empty = sum(k["empty_rounds"] for k in lookup if k)
    return {
        # Tokens per target forward: plain steps (no match, or the scheduler skipping) count as rounds.
        "tau": round(tokens / rounds, 4) if rounds else None,
        "match_fraction": round(matched / (matched + empty), 4) if matched + empty else None,
        "acceptance": round(accepted / drafted, 4) if drafted else None,
        "drafts_per_round": round(drafted / rounds, 4) if rounds else None,
    }


def workload_rows(records: list[dict], kinds: dict[str, str], arm: str) -> list[dict]:
    """One row per workload kind (in first-seen order) for `arm`, plus an "all" row."""
    speed = prompt_speedups(records, arm)
    decode = prompt_speedups(records, arm, decode_tok_s)
    cpu = prompt_speedups(records, arm, cpu_tok_s)
    shares = loop_shares(records)
    order = list(dict.fromkeys(kinds[p] for p in dict.fromkeys(r["prompt"] for r in records)))
    rows = []
    for kind in [*order, "all"]:
        prompts = [p for p in speed if kind == "all" or kinds[p] == kind]
        looping = [p for p in prompts if is_looping(shares.get(p, 0.0))]
        runs = [r for r in records if r["arm"] == arm and r["prompt"] in prompts]
        rows.append({
            "kind": kind, "arm": arm, "prompts": len(prompts), "looping_prompts": len(looping),
            "speedup": _median([speed[p] for p in prompts]),
            "speedup_non_looping": _median([speed[p] for p in prompts if p not in looping]),
            "speedup_looping": _median([speed[p] for p in looping]),
            "speedup_min": round(min((speed[p] for p in prompts), default=0.0), 4) if prompts else None,
            # The same ratios after the first token: what speculation changes (prefill is the same forward).
            "decode_speedup": _median([decode[p] for p in prompts if p in decode]),
            "decode_speedup_non_looping": _median([decode[p] for p in prompts if p in decode and p not in looping]),
            # The same ratios on server CPU time (server runs only): robust to other work on the CPU.
            "cpu_speedup": _median([cpu[p] for p in prompts if p in cpu]),
            "cpu_speedup_non_looping": _median([cpu[p] for p in prompts if p in cpu and p not in looping]),
            **_counts(runs),
            "same_output": round(sum(r["same_as_baseline"] for r in runs) / len(runs), 4) if runs else None,
        })
    return rows


def summarize_workloads(records: list[dict], kinds: dict[str, str], arms: list[str]) -> dict:
    """Rows for every speculative arm, and each prompt's loop share and looping verdict."""
    shares = loop_shares(records)
    return {
        "loop_ngram": LOOP_NGRAM, "loop_threshold": LOOP_THRESHOLD,
        "rows": [row for arm in arms if arm != BASELINE for row in workload_rows(records, kinds, arm)],
        "loop_share": {p: round(s, 4) for p, s in shares.items()},
        "kinds": kinds,
    }
