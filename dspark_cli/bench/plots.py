"""PNG plots of a benchmark report: speedup vs cap per mode, and acceptance by draft position."""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("plots need matplotlib: pip install 'dspark-serve[bench]'") from exc
    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    return plt


def speedup_plot(report: dict, path: Path) -> Path:
    """Median paired speedup vs baseline (min-max bars) per fixed cap, the model's prediction dashed."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    s = report["summary"]
    for mode, model in s["model"].items():
        caps = [r["cap"] for r in model["by_cap"]]
        ratios = [s["speedup_vs_baseline"][f"{mode}@{c}"]["decode"] for c in caps]
        med = [r["median"] for r in ratios]
        err = [[m - r["min"] for m, r in zip(med, ratios)], [r["max"] - m for m, r in zip(med, ratios)]]
        line = ax.errorbar(caps, med, yerr=err, marker="o", capsize=3, label=f"{mode} measured")
        ax.plot(caps, [r["predicted_speedup"] for r in model["by_cap"]], "--", color=line[0].get_color(),
                label=f"{mode} predicted")
        auto = s["speedup_vs_baseline"].get(f"{mode}@auto")
        if auto and model.get("auto_mean_drafts_per_round") is not None:
            ax.plot([model["auto_mean_drafts_per_round"]], [auto["decode"]["median"]], "*", markersize=12,
                    color=line[0].get_color(), label=f"{mode} auto")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("draft cap (drafts verified per round)")
    ax.set_ylabel("decode speedup vs baseline")
    ax.set_title(f"{report['target']} on {report['environment']['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def acceptance_plot(report: dict, path: Path) -> Path:
    """Conditional acceptance at each draft position, per mode, at that mode's largest timed cap."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, model in report["summary"]["model"].items():
        if model["by_cap"]:
            acc = model["by_cap"][-1]["acceptance_by_position"]
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=f"{mode} (cap {model['by_cap'][-1]['cap']})")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("draft position")
    ax.set_ylabel("P(accepted | earlier drafts accepted)")
    ax.set_title("acceptance by position (greedy)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(report: dict, out: Path) -> list[str]:
    """Both plots into `out`; their file names (none when no speculative mode ran)."""
    if not report["summary"]["model"]:
        return []
    return [speedup_plot(report, out / "speedup_vs_cap.png").name,
            acceptance_plot(report, out / "acceptance_by_position.png").name]
