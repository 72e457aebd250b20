"""load.json, load.md and load.png of a sweep."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(report: dict, out: Path) -> Path:
    """The whole report as JSON."""
    path = out / "load.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    return path


def _v(x) -> str:
    return "-" if x is None else str(x)


def write_markdown(report: dict, out: Path) -> Path:
    """One table row per concurrency level, plus the server's speculative statistics when present."""
    lines = [f"# Load test ({report['date']})", "", f"Command: `{report['command']}`", "",
             f"- server: {report['base_url']}, model `{report['model']}`; {report['max_tokens']} tokens per request, "
             f"greedy, streamed; {report['requests']} requests per level", "",
             "| concurrency | ok | 429 | errors | TTFT p50 / p95 ms | ITL p50 / p95 ms | e2e p50 / p95 ms | "
             "stream decode tok/s | throughput tok/s |", "|" + "---|" * 9]
    for lv in report["levels"]:
        lines.append(f"| {lv['concurrency']} | {lv['ok']} | {lv['rejected_429']} | {lv['errors']} | "
                     f"{_v(lv['ttft_ms']['p50'])} / {_v(lv['ttft_ms']['p95'])} | "
                     f"{_v(lv['itl_ms']['p50'])} / {_v(lv['itl_ms']['p95'])} | "
                     f"{_v(lv['e2e_ms']['p50'])} / {_v(lv['e2e_ms']['p95'])} | "
                     f"{_v(lv['stream_decode_tok_s_p50'])} | {_v(lv['throughput_tok_s'])} |")
    spec = [(lv["concurrency"], lv["server_spec"]) for lv in report["levels"] if lv["server_spec"]]
    if spec:
        lines += ["", "Server statistics (dspark_stats): "]
        lines += [f"- concurrency {c}: mode {s['mode']} cap {s['cap']}, tau {s['mean_accepted_length']}, engine decode "
                  f"{s['server_decode_tok_s_p50']} tok/s, client/engine decode rate {_v(s['client_over_engine_decode_p50'])}"
                  for c, s in spec]
    errors = [f"- concurrency {lv['concurrency']}: {e}" for lv in report["levels"] for e in lv["error_samples"]]
    lines += (["", "Errors:"] + errors) if errors else []
    if report.get("plot"):
        lines += ["", f"![latency and throughput]({report['plot']})"]
    path = out / "load.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_multiturn_markdown(report: dict, out: Path) -> Path:
    """One table row per turn of a --multi-turn run."""
    lines = [f"# Multi-turn load test ({report['date']})", "", f"Command: `{report['command']}`", "",
             f"- server: {report['base_url']}, model `{report['model']}`; {report['conversations']} conversations "
             f"of {report['turns']} turns, one request at a time, a shared system prompt of "
             f"{report['system_words']} words; {report['max_tokens']} tokens per turn, greedy, streamed", "",
             "| turn | requests | errors | TTFT p50 / p95 ms | turn-1 TTFT / this | prompt tokens p50 | "
             "cached tokens p50 | cached fraction p50 |", "|" + "---|" * 8]
    for row in report["per_turn"]:
        lines.append(f"| {row['turn']} | {row['requests']} | {row['errors']} | {_v(row['ttft_ms']['p50'])} / "
                     f"{_v(row['ttft_ms']['p95'])} | {_v(row['turn1_over_this_ttft'])} | {_v(row['prompt_tokens_p50'])} | "
                     f"{_v(row['cached_tokens_p50'])} | {_v(row['cached_fraction_p50'])} |")
    errors = [f"- turn {row['turn']}: {e}" for row in report["per_turn"] for e in row["error_samples"]]
    lines += (["", "Errors:"] + errors) if errors else []
    path = out / "multiturn.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _nan(x) -> float:
    return float("nan") if x is None else x


def write_plot(report: dict, out: Path) -> str | None:
    """TTFT and e2e percentiles and throughput against concurrency (None without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = report["levels"]
    conc = [lv["concurrency"] for lv in levels]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    for key, label in (("ttft_ms", "TTFT"), ("e2e_ms", "end to end")):
        for q, style in (("p50", "-o"), ("p95", "--o")):
            ax1.plot(conc, [_nan(lv[key][q]) for lv in levels], style, label=f"{label} {q}")
    ax1.set_xlabel("concurrency")
    ax1.set_ylabel("ms")
    ax1.legend(fontsize=8)
    ax2.plot(conc, [_nan(lv["throughput_tok_s"]) for lv in levels], "-o")
    ax2.set_xlabel("concurrency")
    ax2.set_ylabel("throughput (tokens/s)")
    fig.tight_layout()
    fig.savefig(out / "load.png", dpi=100)
    plt.close(fig)
    return "load.png"
