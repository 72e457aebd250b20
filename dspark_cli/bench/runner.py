"""Interleaved timing: every arm runs on every prompt in each pass, in alternating order.

A "block" is one (prompt, pass): all arms run back to back, forward on even blocks and reversed on
odd ones (A B C, then C B A), so slow drift of the machine (thermal, other load) hits every arm
alike. Ratios are only ever taken between runs of the same block: that is the pairing.
"""

from __future__ import annotations

from collections.abc import Callable

from dspark_cli.bench.workloads import repeated_ngram_share


def schedule(num_prompts: int, repeats: int, arm_names: list[str]) -> list[tuple[int, int, list[str]]]:
    """[(prompt index, pass, arm order)] for every block, in run order."""
    blocks = []
    for p in range(num_prompts):
        for r in range(repeats):
            forward = (p * repeats + r) % 2 == 0
            blocks.append((p, r, list(arm_names) if forward else list(reversed(arm_names))))
    return blocks


def warm_up(arms, prompt_ids: list[int], tokens: int) -> None:
    """One short untimed run per arm: the first call of each shape pays for allocation."""
    for arm in arms:
        arm.run(prompt_ids, tokens)


def run_blocks(arms, prompts: list[tuple[str, list[int]]], repeats: int, max_tokens: int,
               tick: Callable[[str], None] = lambda s: None) -> list[dict]:
    """Time every arm on every prompt `repeats` times; one record per run (ids dropped)."""
    by_name = {a.name: a for a in arms}
    records = []
    for block, (p, r, order) in enumerate(schedule(len(prompts), repeats, list(by_name))):
        prompt_id, ids = prompts[p]
        for name in order:
            arm = by_name[name]
            run = arm.run(ids, max_tokens)
            records.append({"block": block, "prompt": prompt_id, "pass": r, "arm": name, "mode": arm.mode,
                            "cap": arm.cap, "prompt_tokens": len(ids), **run})
            tick(f"{prompt_id} pass {r + 1} {name}")
    _mark_same_output(records)
    return records


def _mark_same_output(records: list[dict]) -> None:
    # Greedy decoding is lossless: every arm should emit the baseline's ids (up to fp ties), and the
    # same text where the arm returns text (the server arms). The ids are dropped once compared; the
    # looping measure of each output is kept instead (see workloads.py).
    base = {r["block"]: (r["ids"], r.get("text")) for r in records if r["arm"] == "baseline"}
    for r in records:
        ids, text = r.pop("ids"), r.pop("text", None)
        base_ids, base_text = base.get(r["block"], (ids, text))
        r["same_as_baseline"] = ids == base_ids and text == base_text
        r["repeat_share"] = round(repeated_ngram_share(ids), 4)
