"""The structured-output arm's numbers (`dspark bench --structured`): what the grammar costs a round.

Every engine run under a schema counts the grammar mask rows it computed and the time spent in
llguidance (computing the masks and advancing the matcher past committed tokens; expanding a mask
and applying it to the logits run inside the MLX graph and are not separable). Per arm the medians
over runs: mask rows per round, that time per mask row, and its share of the decode time.
"""

from __future__ import annotations

import statistics


def summarize_grammar(records: list[dict], arm_names: list[str]) -> dict:
    """{arm: {"masks_per_round", "us_per_mask", "share_of_decode", "runs"}} over runs that computed
    masks; {} when no run did."""
    out = {}
    for name in arm_names:
        runs = [r for r in records if r["arm"] == name and r.get("grammar_masks")]
        if not runs:
            continue
        out[name] = {
            "runs": len(runs),
            "masks_per_round": round(statistics.median(r["grammar_masks"] / max(r["rounds"], 1) for r in runs), 3),
            "us_per_mask": round(statistics.median(1e6 * r["grammar_s"] / r["grammar_masks"] for r in runs), 1),
            "share_of_decode": round(statistics.median(r["grammar_s"] / r["decode_s"] for r in runs if r["decode_s"]), 4),
        }
    return out


def grammar_table(report: dict) -> list[str]:
    """The report.md section for `summarize_grammar`'s numbers (none without a structured run)."""
    grammar = report["summary"].get("grammar")
    if not grammar:
        return []
    lines = ["## Grammar masks (medians over runs)", "",
             "Time in llguidance (computing each row's allowed-token mask and advancing past committed "
             "tokens), per mask row and as a share of decode time. A round computes one row per draft it "
             "samples and one per verify row.", "",
             "| arm | runs | mask rows per round | us per mask row | share of decode time |", "|" + "---|" * 5]
    for name, g in grammar.items():
        lines.append(f"| {name} | {g['runs']} | {g['masks_per_round']:.2f} | {g['us_per_mask']:.0f} | "
                     f"{g['share_of_decode']:.1%} |")
    return lines + [""]
