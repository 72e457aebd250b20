"""Write a drafter's model card (README.md) from its training.json and a `dspark eval-drafter` report.

Usage: python scripts/model_card.py DRAFTER_DIR TRAINING_JSON EVAL_JSON [--train-command CMD] [--eval-command CMD]

Every number in the card comes from those two files, so the card is as reproducible as they are.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors")) / 1e6


def _fmt(values, digits: int = 3) -> str:
    return " ".join("-" if v is None else f"{v:.{digits}f}" for v in values)


def _drafter_section(folder: Path, t: dict) -> list[str]:
    d = t["drafter"]
    return [
        f"- Variant: **{t['variant']}**, checkpoint layout `{t['layout']}` ({d['architecture']}), "
        f"{d['save_dtype']}, {_size_mb(folder):.1f} MB of weights",
        f"- {d['layers']} decoder layers, {d['drafts']} drafts per round (block size {d['block_size']}), "
        f"Markov rank {d['markov_rank']}, confidence head {'yes' if d['confidence_head'] else 'no'}, "
        f"target layers tapped {d['taps']}, {d['trainable_parameters'] / 1e6:.2f} M trainable parameters "
        "(embedding and lm_head are the target's, bound at load time)",
    ]


def _training_section(t: dict) -> list[str]:
    data, tr, wall = t["data"], t["train"], t["wall_s"]
    return [
        f"- Data: {data['train_samples']} training samples ({data['train_tokens']} tokens, "
        f"{data['train_loss_tokens']} answer tokens trained on), {data['heldout_samples']} held out",
        f"- Steps: {tr['steps']} (batch {tr['batch']} sequences x {tr['anchors']} anchor blocks, lr {tr['lr']}, "
        f"warm-up {tr['warmup_steps']} steps then cosine, loss weights ce/tv/conf {tr['loss_weights']})",
        f"- Wall time on this machine (2 CPU cores, MLX {t['versions']['mlx']}): features "
        f"{wall.get('features_s', 0) / 60:.1f} min, training {tr['train_wall_s'] / 60:.1f} min "
        f"({tr['anchor_tokens_per_s']} anchor tokens/s), evaluation {wall.get('eval_s', 0) / 60:.1f} min",
    ]


def _eval_section(e: dict) -> list[str]:
    lines = [f"Greedy, {e['max_tokens']} tokens per prompt, prompts never seen in training "
             "(`data/prompts/heldout_*.jsonl`, from documentation and source files held out by path):", "",
             "| prompt set | prompts | best cap | tau at best cap | tau by cap 1..K | acceptance by position (cap K) |",
             "|---|---|---|---|---|---|"]
    for name, s in e["sets"].items():
        caps = s["by_cap"]
        lines.append(f"| {name} | {s['prompts']} | {s['best_cap']} | **{s['best_tau']:.2f}** | "
                     f"{_fmt([c['tau'] for c in caps], 2)} | {_fmt(caps[-1]['acceptance_by_position'], 2)} |")
    calib = [(n, s["calibration"]) for n, s in e["sets"].items() if s.get("calibration")]
    if calib:
        lines += ["", "Confidence head, ECE of the prefix-survival product per position (20 bins), "
                  "before / after the stored STS temperatures:", ""]
        lines += [f"- {n}: before {_fmt(c['ece_before'])}; after {_fmt(c['ece_after'])} "
                  f"(samples per position {c['samples_by_position']})" for n, c in calib]
    if "speed" in e:
        sp = e["speed"]
        lines += ["", f"End-to-end greedy speed over baseline mode (same process, interleaved per prompt, "
                  f"{len(sp['prompts'])} prompts): median **x{sp['median_ratio']:.2f}** "
                  f"(min x{sp['min_ratio']:.2f}, max x{sp['max_ratio']:.2f}), median tau {sp['median_tau']:.2f}, "
                  f"outputs identical to baseline: {sp['all_outputs_identical']}"]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("training", type=Path)
    ap.add_argument("eval", type=Path)
    ap.add_argument("--train-command", default="")
    ap.add_argument("--eval-command", default="")
    ap.add_argument("--notes", default="")
    args = ap.parse_args()
    t, e = json.loads(args.training.read_text()), json.loads(args.eval.read_text())
    title = f"{args.folder.name}: a {t['variant']} drafter for SmolLM2-135M-Instruct"
    lines = [f"# {title}", "", "## Drafter", *_drafter_section(args.folder, t), "",
             "## Training", *_training_section(t), "", "## Held-out results", *_eval_section(e)]
    if args.notes:
        lines += ["", "## Notes", args.notes]
    lines += ["", "## Reproduce"]
    for label, cmd in (("Train", args.train_command), ("Evaluate", args.eval_command)):
        if cmd:
            lines += ["", f"{label}:", "", "```", cmd, "```"]
    (args.folder / "README.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
