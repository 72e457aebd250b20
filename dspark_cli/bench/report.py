"""report.json and report.md of a benchmark run."""

from __future__ import annotations

import json
from pathlib import Path

from dspark_cli.bench.structured import grammar_table


def write_json(report: dict, out: Path) -> Path:
    """The full report, runs included, as JSON."""
    path = out / "report.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    return path


def _fmt(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _range(s: dict, digits: int = 2) -> str:
    if not s or s.get("median") is None:
        return "-"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def _header(report: dict) -> list[str]:
    env, plan = report["environment"], report["plan"]
    return [
        f"# dspark bench ({report['date']})", "",
        f"Command: `{report['command']}`", "",
        f"- target: {report['target']}; drafters: " + (", ".join(f"{m}: {d}" for m, d in report["drafters"].items())
                                                    or "none"),
        f"- device: {env['device']} ({env['platform']}, {env['cores']} cores); MLX {env['mlx']}",
        f"- BLAS: {env['blas']} at {env['sgemm_gflops']} GFLOP/s (fp32 sgemm 1024^3)",
        f"- prompts: {report['prompts']['file']} ({report['prompts']['count']} prompts, sha256 "
        f"{report['prompts']['sha256'][:12]}), {plan['max_tokens']} tokens, greedy, {plan['repeats']} passes, "
        f"interleaved A B ... B A",
        *_auto_line(report["auto_cap_at_start"]),
        *[f"- skipped: {note}" for note in report["skipped"]],
        *_verify_line(report["summary"].get("target_verify")), "",
    ]


def _auto_line(caps: dict) -> list[str]:
    if not caps:
        return []
    return ["- auto's cap before any round (prior acceptance): " + ", ".join(f"{m} {c}" for m, c in caps.items())]


def _threads_line(threads: int | None) -> list[str]:
    if threads is None:
        return []
    return ["", f"Decode rounds ran at {threads} BLAS thread(s), the count the engine measured as fastest for them "
                "(prefill and baseline steps run at the loaded count)."]


def _verify_line(tv: dict | None) -> list[str]:
    if not tv:
        return []
    def cells(curve: dict) -> str:
        return ", ".join(f"{w}: {ms:.1f} ms (x{r:.2f})" for w, ms, r in zip(tv["widths"], curve["ms"], curve["relative"]))

    threads = f", {tv['threads']} BLAS threads" if tv.get("threads") else ""
    lines = [f"- target verify cost by width (tokens in one forward, context {tv['context']}{threads}): {cells(tv)}"]
    return lines + [f"- the same at {c['threads']} BLAS thread(s): {cells(c)}" for c in tv.get("other_threads", [])]


def _arm_table(report: dict) -> list[str]:
    s = report["summary"]
    vs_mlx = s.get("speedup_vs_mlx_lm", {})
    lines = ["## Arms (medians, min-max over paired runs)", "",
             "| arm | e2e tok/s | decode tok/s | speedup vs baseline | vs mlx-lm | tau | drafts/round | "
             "round ms (draft/verify/accept/other) | same output |", "|" + "---|" * 9]
    for name, a in s["arms"].items():
        ratio = s["speedup_vs_baseline"].get(name, {}).get("e2e")
        mlx = vs_mlx.get(name, {}).get("e2e")
        split = a["round_ms"]
        split_text = "/".join(_fmt(split[k]) for k in ("draft", "verify", "accept", "other")) if split else "-"
        lines.append(f"| {name} | {_range(a['e2e_tok_s'], 1)} | {_range(a['decode_tok_s'], 1)} | "
                     f"{_range(ratio) if ratio else '1'} | {_range(mlx) if mlx else '-'} | "
                     f"{_fmt(a['mean_accepted_length'])} | {_fmt(a['mean_drafts_per_round'])} | {split_text} | "
                     f"{a['same_output_as_baseline']:.0%} |")
    return lines + [""]


def _model_tables(report: dict) -> list[str]:
    lines = []
    for mode, m in report["summary"]["model"].items():
        lines += [f"## Performance model: {mode}", "",
                  "Predicted decode speedup = expected tokens per round / (round time / one decode step).",
                  *_threads_line(m.get("curve", {}).get("decode_threads")), "",
                  "| cap | acceptance by position | round time rel. predicted | measured | speedup predicted | "
                  "measured | ceiling |", "|" + "---|" * 7]
        for r in m["by_cap"]:
            acc = " ".join(f"{x:.2f}" for x in r["acceptance_by_position"])
            lines.append(f"| {r['cap']} | {acc} | {_fmt(r['predicted_round_time_rel'])} | "
                         f"{_fmt(r['measured_round_time_rel'])} | {_fmt(r['predicted_speedup'])} | "
                         f"{_fmt(r['measured_speedup'])} | {_fmt(r['ceiling'])} |")
        lines += ["", f"- model's best cap: {m.get('model_best_cap')} (predicted x{_fmt(m.get('model_best_speedup'))}); "
                      f"best measured fixed cap: {m.get('best_fixed_cap')} (x{_fmt(m.get('best_fixed_speedup'))})",
                  f"- auto: {_fmt(m.get('auto_mean_drafts_per_round'))} drafts per round on average, "
                  f"x{_fmt(m.get('auto_speedup'))}, {_fmt(m.get('auto_vs_best_fixed'))} of the best fixed cap", ""]
        apple = report.get("apple_silicon_prediction", {}).get(mode)
        if apple:
            lines += [f"- **Prediction, not a measurement** (Apple Silicon, assumed verify cost 1 + "
                      f"{apple['row_growth']} per row): best cap {apple['best_cap']}, decode speedup "
                      f"x{_fmt(apple['speedup'])}", ""]
    return lines


def _prompt_table(report: dict) -> list[str]:
    per = report["summary"]["per_prompt"]
    arms = list(report["summary"]["arms"])
    lines = ["## Per prompt (median e2e tok/s; speedup vs baseline)", "", "| prompt | " + " | ".join(arms) + " |",
             "|" + "---|" * (len(arms) + 1)]
    for prompt, row in per.items():
        cells = [f"{_fmt(row[a]['e2e_tok_s'], 1)}" + (f" (x{_fmt(row[a]['speedup_vs_baseline'])})"
                                                       if row[a]["speedup_vs_baseline"] else "") for a in arms]
        lines.append(f"| {prompt} | " + " | ".join(cells) + " |")
    return lines + [""]


WORKLOAD_COLUMNS = ("workload", "arm", "prompts", "looping", "speedup all", "non-looping", "looping",
                    "min", "decode speedup all", "decode non-looping", "CPU-time speedup all", "CPU non-looping", "tau", "match fraction", "acceptance",
                    "same output")


def _workload_table(report: dict) -> list[str]:
    w = report["summary"].get("workloads")
    if not w:
        return []
    lines = ["## Per workload (median over prompts of the paired e2e speedup vs baseline)", "",
             f"A prompt is looping when more than {w['loop_threshold']:.0%} of the {w['loop_ngram']}-token n-grams of "
             "its baseline output already occurred earlier in that output. tau: tokens per target forward (plain "
             "steps included); match fraction: share of lookup's attempts that found a match; acceptance: accepted "
             "/ drafted tokens. Decode speedup: the same ratios on tokens per second after the first token "
             "(prefill excluded: it is the same target forward in both arms). CPU-time speedup (server runs): the same ratios on the server process's CPU "
             "seconds per request, which other work on a shared CPU does not inflate.", "",
             "| " + " | ".join(WORKLOAD_COLUMNS) + " |", "|" + "---|" * len(WORKLOAD_COLUMNS)]
    for r in w["rows"]:
        speeds = [r["speedup"], r["speedup_non_looping"], r["speedup_looping"], r["speedup_min"],
                  r["decode_speedup"], r["decode_speedup_non_looping"], r["cpu_speedup"], r["cpu_speedup_non_looping"]]
        cells = [r["kind"], r["arm"], str(r["prompts"]), str(r["looping_prompts"]),
                 *("-" if x is None else f"x{x:.2f}" for x in speeds),
                 _fmt(r["tau"]), _fmt(r["match_fraction"]), _fmt(r["acceptance"]),
                 "-" if r["same_output"] is None else f"{r['same_output']:.0%}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def write_markdown(report: dict, out: Path) -> Path:
    """A readable summary: setup, per-workload and per-arm tables, the model's predictions, per-prompt speeds."""
    lines = (_header(report) + _workload_table(report) + _arm_table(report) + grammar_table(report)
             + _model_tables(report) + _prompt_table(report))
    lines += [f"![{p}]({p})" for p in report.get("plots", [])]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
