"""From timed runs to the report's numbers: speeds, paired ratios, acceptance, round breakdown,
and the performance model's predictions next to what was measured.

Speeds: end to end = tokens / wall time of the request (prefill included); decode = tokens
committed after the first / time after prefill. A ratio is always arm / reference within one block
(same prompt, same pass, run back to back), and its summary is the median with min and max.
"""

from __future__ import annotations

import statistics

from dspark_cli.bench.arms import BASELINE, MLX_LM

PHASES = ("draft", "verify", "accept", "other")


def spread(values: list[float]) -> dict:
    """Median with min and max (and the count), rounded for the report."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "n": len(values)}


def e2e_tok_s(run: dict) -> float:
    """Tokens per second of the whole request."""
    return run["tokens"] / run["wall_s"] if run["wall_s"] > 0 else 0.0


def decode_tok_s(run: dict) -> float:
    """Tokens per second after prefill."""
    return run["decode_tokens"] / run["decode_s"] if run["decode_s"] > 0 else 0.0


def paired_ratios(records: list[dict], arm: str, reference: str, speed) -> list[dict]:
    """speed(arm) / speed(reference) for every block in which both ran."""
    ref = {r["block"]: r for r in records if r["arm"] == reference}
    out = []
    for r in records:
        if r["arm"] == arm and r["block"] in ref and speed(ref[r["block"]]) > 0:
            out.append({"block": r["block"], "prompt": r["prompt"], "pass": r["pass"],
                        "ratio": round(speed(r) / speed(ref[r["block"]]), 4)})
    return out


def _ratio_summary(records: list[dict], arm: str, reference: str) -> dict:
    e2e = paired_ratios(records, arm, reference, e2e_tok_s)
    dec = paired_ratios(records, arm, reference, decode_tok_s)
    return {"e2e": spread([p["ratio"] for p in e2e]), "decode": spread([p["ratio"] for p in dec]), "pairs": e2e,
            "decode_pairs": dec}


def _pooled_acceptance(runs: list[dict]) -> list[float]:
    acc, ver = [], []
    for r in runs:
        for i, (a, v) in enumerate(zip(r.get("accepted_by_position", []), r.get("verified_by_position", []))):
            if i == len(acc):
                acc.append(0)
                ver.append(0)
            acc[i] += a
            ver[i] += v
    return [round(a / v, 4) if v else 0.0 for a, v in zip(acc, ver)]


def _round_breakdown_ms(runs: list[dict]) -> dict | None:
    rounds = sum(r["rounds"] for r in runs)
    if not rounds or "time_s" not in runs[0]:
        return None
    return {ph: round(1000 * sum(r["time_s"][ph] for r in runs) / rounds, 3) for ph in PHASES}


def arm_summary(records: list[dict], arm: str) -> dict:
    """Speeds, tau, acceptance by position and the mean round's time split for one arm."""
    runs = [r for r in records if r["arm"] == arm]
    rounds = sum(r["rounds"] for r in runs)
    return {
        "mode": runs[0]["mode"], "cap": runs[0]["cap"], "runs": len(runs),
        "e2e_tok_s": spread([e2e_tok_s(r) for r in runs]), "decode_tok_s": spread([decode_tok_s(r) for r in runs]),
        "mean_accepted_length": round(sum(r["decode_tokens"] for r in runs) / rounds, 4) if rounds else None,
        "mean_drafts_per_round": round(sum(r.get("drafted", 0) for r in runs) / rounds, 4) if rounds else None,
        "acceptance_by_position": _pooled_acceptance(runs),
        "round_ms": _round_breakdown_ms(runs),
        "round_ms_total": round(1000 * sum(r["decode_s"] for r in runs) / rounds, 3) if rounds else None,
        "same_output_as_baseline": sum(r["same_as_baseline"] for r in runs) / len(runs),
    }


def per_prompt(records: list[dict], arms: list[str]) -> dict:
    """Per prompt and arm: median end-to-end and decode tokens/s, median paired speedup vs baseline."""
    out = {}
    for prompt in dict.fromkeys(r["prompt"] for r in records):
        rows = [r for r in records if r["prompt"] == prompt]
        out[prompt] = {a: {"e2e_tok_s": spread([e2e_tok_s(r) for r in rows if r["arm"] == a])["median"],
                           "decode_tok_s": spread([decode_tok_s(r) for r in rows if r["arm"] == a])["median"],
                           "speedup_vs_baseline": spread([p["ratio"] for p in
                                                          paired_ratios(rows, a, BASELINE, e2e_tok_s)])["median"]}
                       for a in arms}
    return out


def summarize(records: list[dict], arms: list, curves: dict) -> dict:
    """Everything derived from the runs: per arm, per prompt, ratios, predictions, auto's choice."""
    names = [a.name for a in arms]
    out = {"arms": {n: arm_summary(records, n) for n in names}, "per_prompt": per_prompt(records, names)}
    out["speedup_vs_baseline"] = {n: _ratio_summary(records, n, BASELINE) for n in names if n != BASELINE}
    if MLX_LM in names:
        out["speedup_vs_mlx_lm"] = {n: _ratio_summary(records, n, MLX_LM) for n in names if n != MLX_LM}
    out["model"] = {mode: predictions(out, mode, curve) for mode, curve in curves.items()}
    return out


def predictions(summary: dict, mode: str, curve) -> dict:
    """Predicted vs measured decode speedup per cap, the model's best cap, and auto against it."""
    arms = {n: a for n, a in summary["arms"].items() if a["mode"] == mode}
    fixed = sorted((a["cap"], n) for n, a in arms.items() if isinstance(a["cap"], int))
    base = summary["arms"][BASELINE]
    rows = []
    for cap, name in fixed:
        a = arms[name]
        measured_rel = a["round_ms_total"] / base["round_ms_total"] if a["round_ms_total"] and base["round_ms_total"] else None
        rows.append({"cap": cap, "acceptance_by_position": a["acceptance_by_position"],
                     "predicted_round_time_rel": round(curve.relative_round_time(cap), 4),
                     "measured_round_time_rel": round(measured_rel, 4) if measured_rel else None,
                     "predicted_speedup": round(curve.predicted_speedup(a["acceptance_by_position"], cap), 4),
                     "measured_speedup": summary["speedup_vs_baseline"][name]["decode"]["median"],
                     "ceiling": round(curve.ceiling(cap), 4)})
    out = {"curve": curve_dict(curve), "by_cap": rows}
    if fixed:
        out |= _auto_vs_best(summary, mode, curve, arms[fixed[-1][1]]["acceptance_by_position"], fixed)
    return out


def _auto_vs_best(summary: dict, mode: str, curve, acceptance: list[float], fixed: list) -> dict:
    # The model's choice from the acceptance measured at the largest cap, and how auto really did.
    model_cap, _ = curve.best_cap(acceptance, len(acceptance))
    speed = {n: summary["speedup_vs_baseline"][n]["e2e"]["median"] for _, n in fixed}
    best_name = max(speed, key=lambda n: speed[n] or 0.0)
    out = {"model_best_cap": model_cap,
           "model_best_speedup": round(curve.predicted_speedup(acceptance, model_cap), 4),
           "best_fixed_cap": summary["arms"][best_name]["cap"], "best_fixed_speedup": speed[best_name]}
    auto = summary["arms"].get(f"{mode}@auto")
    if auto is not None:
        auto_speed = summary["speedup_vs_baseline"][f"{mode}@auto"]["e2e"]["median"]
        out |= {"auto_mean_drafts_per_round": auto["mean_drafts_per_round"], "auto_speedup": auto_speed,
                "auto_vs_best_fixed": round(auto_speed / speed[best_name], 4) if speed[best_name] else None}
    return out


def curve_dict(curve) -> dict:
    """The cost curve in milliseconds and relative to one plain decode step."""
    n = len(curve.verify_s)
    return {"verify_ms": [round(1000 * t, 3) for t in curve.verify_s],
            "draft_fixed_ms": round(1000 * curve.draft_fixed_s, 3),
            "draft_per_token_ms": round(1000 * curve.draft_per_token_s, 3),
            "round_time_rel": [round(curve.relative_round_time(k), 4) for k in range(n)],
            "decode_threads": getattr(curve, "decode_threads", None),
            "plain_step_ms": round(1000 * curve.round_time(0), 3)}
