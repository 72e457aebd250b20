"""`dspark eval-drafter`: the held-out numbers of a drafter, rerunnable by any reader.

Example (the shipped DSpark drafter of the default model, on the committed held-out prompts):

    dspark eval-drafter --prompts data/prompts/heldout_docs.jsonl --prompts data/prompts/heldout_chat.jsonl \\
        --speed-prompts 5 --out heldout.json

Per prompt file: greedy tau and acceptance by position at each cap; the same at the best cap with
the drafter's target context replaced by zero rows (how much of its acceptance comes from reading
the target); for a DSpark drafter the ECE of its confidence head before and after the stored STS
temperatures; then the paired end-to-end speed of the drafter's mode over baseline mode on the
first prompts of the first file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dspark_cli.progress import stderr_progress
from dspark_cli.spec_args import add_spec_args, engine_config


def add_parser(sub) -> None:
    p = sub.add_parser("eval-drafter", help="measure a drafter on held-out prompts (tau, calibration, speed)")
    p.add_argument("--prompts", action="append", required=True, metavar="JSONL",
                   help='held-out prompt records {"messages": [...]} or {"prompt": "..."}; repeatable')
    p.add_argument("--num-prompts", type=int, default=16, help="prompts used from each file")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens generated per prompt")
    p.add_argument("--caps", default="all", help="caps to measure tau at: 'all' (1..drafts) or e.g. 1,3,7")
    p.add_argument("--speed-prompts", type=int, default=0,
                   help="paired speed runs (mode vs baseline) on this many prompts of the first file; 0 = skip")
    p.add_argument("--out", type=Path, default=None, help="also write the report as JSON here")
    add_spec_args(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from engine.runtime import build_runtime

    if args.mode in ("baseline", "lookup"):
        print("error: eval-drafter measures a trained drafter; choose --mode dspark or dflash", file=sys.stderr)
        return 2
    runtime = build_runtime(engine_config(args), stderr_progress)
    if runtime.info.drafter_kind not in ("dspark", "dflash"):
        print(f"error: {runtime.info.mode_note or 'no trained drafter is loaded'}", file=sys.stderr)
        return 2
    report = {"model": runtime.info.model_id, "drafter": runtime.info.drafter, "mode": runtime.info.mode,
              "max_tokens": args.max_tokens, "sets": {}}
    prompt_sets = {Path(f).stem: _prompts(f, runtime.tokenizer, args.num_prompts) for f in args.prompts}
    for name, prompts in prompt_sets.items():
        report["sets"][name] = _measure_set(runtime, prompts, args)
    if args.speed_prompts > 0:
        report["speed"] = _speed(args, runtime, next(iter(prompt_sets.values()))[: args.speed_prompts])
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


def _prompts(path: str, tokenizer, limit: int) -> list[list[int]]:
    from engine.train.data import read_prompt_records, record_prompt

    return [record_prompt(r, tokenizer).ids for r in read_prompt_records(path)[:limit]]


def _caps(text: str, drafts: int) -> list[int]:
    if text == "all":
        return list(range(1, drafts + 1))
    return sorted({min(int(c), drafts) for c in text.split(",") if c.strip()})


def _measure_set(runtime, prompts: list[list[int]], args) -> dict:
    from engine.train.heldout_eval import acceptance_by_cap, calibration, context_ablation

    drafter = runtime.drafter
    stderr_progress(f"greedy rounds on {len(prompts)} prompts x {args.max_tokens} tokens")
    by_cap = acceptance_by_cap(runtime.target, drafter, prompts, args.max_tokens,
                               _caps(args.caps, drafter.config.max_drafts), stop_ids=runtime.eos_ids)
    best = max(by_cap, key=lambda row: row["tau"])
    out = {"prompts": len(prompts), "by_cap": by_cap, "best_cap": best["cap"], "best_tau": best["tau"]}
    stderr_progress(f"tau {best['tau']:.3f} at cap {best['cap']}; again with the context zeroed")
    out["context_ablation"] = context_ablation(runtime.target, drafter, prompts, args.max_tokens, best["cap"],
                                               stop_ids=runtime.eos_ids, with_context=best)
    if drafter.has_confidence:
        out["calibration"] = calibration(runtime.target, drafter, prompts, args.max_tokens,
                                         stop_ids=runtime.eos_ids)
    return out


def _speed(args, spec_runtime, prompts: list[list[int]]) -> dict:
    from argparse import Namespace

    from engine.runtime import build_runtime
    from engine.train.heldout_eval import paired_speed

    base_args = Namespace(**{**vars(args), "mode": "baseline"})
    base_runtime = build_runtime(engine_config(base_args), stderr_progress)
    stderr_progress(f"paired speed: {spec_runtime.info.mode} (cap {spec_runtime.info.cap}) vs baseline")
    return paired_speed(spec_runtime, base_runtime, prompts, args.max_tokens, stderr_progress)
