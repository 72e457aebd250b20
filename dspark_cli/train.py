"""`dspark train-drafter`: distil a DSpark (or DFlash) drafter for an mlx-lm target.

Example (the default SmolLM2 target, Python docs, a short run):

    dspark train-drafter --data /usr/share/doc/python3.11/html/_sources/tutorial \\
        --out runs/smollm2-dspark --steps 2000 --block-size 7 --layers 2

Interrupted runs continue with the same command plus ``--resume``. ``--recipe v2`` (the default)
distils from the target's cached top-k with a position curriculum and a go/no-go gate (exit code 3
when the gate stops the run; training.json says why); ``--recipe v1`` is the run-3 recipe.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated layer ids, e.g. 1,14,27") from None


def add_parser(sub) -> None:
    p = sub.add_parser("train-drafter", help="train a DSpark or DFlash drafter for a target model",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("target and data")
    g.add_argument("--model", default=os.environ.get("DSPARK_MODEL"),
                   help="mlx-lm model directory or Hugging Face id; default: embedded SmolLM2-135M-Instruct")
    g.add_argument("--data", action="append", default=[], metavar="PATH",
                   help="text file or directory (*.txt, *.rst, *.md, *.py); repeatable; every token is trained on")
    g.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                   help="skip files under --data directories whose path has a part matching GLOB (e.g. test)")
    g.add_argument("--chat-prompts", action="append", default=[], metavar="JSONL",
                   help='prompt records {"messages": [...]}, {"prompt": "..."} or {"text": "..."}; repeatable')
    g.add_argument("--generate-continuations", type=int, default=0, metavar="N",
                   help="the target answers each prompt with up to N tokens (batched); 0 = use the records' answers")
    g.add_argument("--gen-temperature", type=float, default=0.0, help="sampling temperature of the continuations")
    g.add_argument("--gen-batch", type=int, default=16, help="prompts generated together")
    g.add_argument("--seq-len", type=int, default=512, help="tokens per training sample (text is chunked)")
    g.add_argument("--max-samples", type=int, default=None, help="use a seeded random subset of the samples")
    g.add_argument("--heldout", type=int, default=8, help="samples held out for evaluation")
    g.add_argument("--eval-prompts", default=None, metavar="JSONL",
                   help="held-out prompts for the real-rounds evaluation (default: prefixes of held-out samples)")
    g.add_argument("--heldout-prompts", action="append", default=[], metavar="JSONL",
                   help="held-out prompt files: text files in their path split or containing one of their "
                        "passages are left out of training; repeatable")
    g.add_argument("--heldout-text", type=int, default=0, metavar="N",
                   help="also hold out the passages of the first N records of each --heldout-prompts file (raw "
                        "text; the instruments and the gate score them)")
    g.add_argument("--num-eval-prompts", type=int, default=8)
    g.add_argument("--eval-max-tokens", type=int, default=64, help="tokens generated per evaluation prompt")
    d = p.add_argument_group("drafter")
    d.add_argument("--variant", choices=["dspark", "dflash"], default="dspark")
    d.add_argument("--layout", choices=["deepspec", "compact", "zlab"], default=None,
                   help="checkpoint layout; default deepspec for dspark, zlab for dflash (compact = no embedding copy)")
    d.add_argument("--layers", type=int, default=2, help="draft decoder layers")
    d.add_argument("--block-size", type=int, default=7, help="drafts per round (zlab stores one extra slot)")
    d.add_argument("--markov-rank", type=int, default=64, help="Markov head rank r (dspark)")
    d.add_argument("--markov-head", choices=["vanilla", "gated"], default="vanilla",
                   help="Markov head type (dspark); rnn heads are not supported")
    d.add_argument("--taps", type=_int_list, default=None, help="target layers to tap, e.g. 1,14,27")
    d.add_argument("--num-taps", type=int, default=3, help="taps spread over the target when --taps is not given")
    d.add_argument("--mask-token-id", type=int, default=None, help="default: an unused special token")
    t = p.add_argument_group("optimisation (flags left unset take the --recipe's value)")
    t.add_argument("--recipe", choices=["v1", "v2"], default="v2",
                   help="v1: run 3's 0.1 CE + 0.9 TV; v2: distillation + hidden regression with a position "
                        "curriculum, Markov head frozen early, AdamW with decay, instruments and a go/no-go gate")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--batch", type=int, default=argparse.SUPPRESS, help="sequences per step (v1 2, v2 8)")
    t.add_argument("--anchors", type=int, default=argparse.SUPPRESS, help="anchor blocks per sequence (v1 64, v2 32)")
    t.add_argument("--lr", type=float, default=argparse.SUPPRESS, help="peak learning rate (v1 6e-4, v2 2e-3)")
    t.add_argument("--warmup", type=float, default=argparse.SUPPRESS, help="warm-up fraction of the steps (v1 0.04, v2 0.03)")
    t.add_argument("--weight-decay", type=float, default=argparse.SUPPRESS, help="AdamW weight decay (v1 0, v2 0.05)")
    t.add_argument("--beta2", type=float, default=argparse.SUPPRESS, help="AdamW beta2 (v1 0.999, v2 0.95)")
    t.add_argument("--min-lr-frac", type=float, default=argparse.SUPPRESS, help="cosine floor as a fraction of --lr (v1 0, v2 0.1)")
    t.add_argument("--objective", choices=["ce_tv", "kd"], default=argparse.SUPPRESS,
                   help="ce_tv: 0.1 CE + 0.9 TV; kd: KL to the target over {top-k, label, rest} + hidden regression")
    t.add_argument("--hidden-weight", type=float, default=argparse.SUPPRESS, help="kd: weight of 1 - cos(h_draft, h_target)")
    t.add_argument("--hidden-center", choices=["mean", "none"], default="mean",
                   help="kd: compare hidden states after subtracting the target's mean state (a constant vector "
                        "then scores nothing)")
    t.add_argument("--regress-steps", type=int, default=argparse.SUPPRESS, help="kd: first steps on the hidden regression alone")
    t.add_argument("--early-steps", type=int, default=argparse.SUPPRESS,
                   help="kd: steps on draft positions <= --early-positions, Markov head frozen (v2: 0.6 x steps)")
    t.add_argument("--early-positions", type=int, default=2)
    t.add_argument("--final-steps", type=int, default=argparse.SUPPRESS,
                   help="kd: last steps that add TV and the confidence head (v2: 0.1 x steps)")
    t.add_argument("--markov-lr-mult", type=float, default=argparse.SUPPRESS, help="kd: Markov head lr / lr after the early phase")
    t.add_argument("--instrument-every", type=int, default=argparse.SUPPRESS, help="steps between instrument reports (0 = none)")
    t.add_argument("--gate-core-hours", type=float, default=argparse.SUPPRESS,
                   help="go/no-go after this much CPU time in the early phase (0 = no gate)")
    t.add_argument("--gate-min-match", type=float, default=0.38,
                   help="the gate's teacher-forced held-out greedy match at draft position 1")
    t.add_argument("--shortlist", type=int, default=0, metavar="N",
                   help="kd: distil over the batch's target top-k and labels plus the N most frequent training "
                        "labels instead of the whole vocabulary (a cheaper step); those N tokens are saved as the "
                        "drafter's draft vocabulary (shortlist.json, its label coverage printed), which serving "
                        "drafts from; 0 = whole vocabulary")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--tap-scale", choices=["rms", "none"], default="rms",
                   help="train fc on taps scaled to unit RMS per feature (folded into fc when saved; "
                        "tames targets with massive activations)")
    o = p.add_argument_group("output and resume")
    o.add_argument("--out", required=True, type=Path, help="output directory (drafter, training.json, checkpoints)")
    o.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    o.add_argument("--checkpoint-every", type=int, default=100)
    o.add_argument("--stop-after", type=int, default=None, metavar="N",
                   help="pause after N steps of this invocation (checkpointed; continue with --resume)")
    o.add_argument("--log-every", type=int, default=10)
    o.add_argument("--no-feature-cache", action="store_true", help="recompute target features every step")
    o.add_argument("--feature-dtype", choices=["float32", "float16"], default="float32",
                   help="storage dtype of the feature cache (training always computes in float32)")
    o.add_argument("--features-dir", type=Path, default=None,
                   help="feature cache directory, shareable between runs on the same data (default OUT/features)")
    o.add_argument("--topk", type=int, default=argparse.SUPPRESS,
                   help="keep the target's top-k ids and log-probs per row in the cache (kd needs it; v2 32)")
    o.add_argument("--extract-only", action="store_true",
                   help="build the samples and fill the feature cache, then stop (no training)")
    o.add_argument("--train-chunks", type=int, default=None, metavar="N",
                   help="train on the samples of the first N feature-cache chunks only (default all)")
    o.add_argument("--grow-every", type=int, default=0, metavar="S",
                   help="with --train-chunks N: start on N chunks and widen the window by one chunk every S steps "
                        "(train while another process fills the cache; a missing chunk is computed here)")
    o.add_argument("--save-dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    o.add_argument("--sts-temperature", type=float, default=0.0,
                   help="sampling temperature of the STS calibration rounds (0 = greedy)")
    p.set_defaults(run=run)


def recipe_values(args) -> dict:
    """The optimisation settings: the --recipe's, overridden by every flag given explicitly."""
    from engine.train.config import RECIPES

    out = dict(RECIPES[args.recipe])
    # Recipe flags have no parser default (argparse.SUPPRESS): an attribute exists only when given.
    flags = {"batch": "batch", "anchors": "anchors", "lr": "lr", "warmup_frac": "warmup",
             "weight_decay": "weight_decay", "beta2": "beta2", "min_lr_frac": "min_lr_frac", "objective": "objective",
             "topk": "topk", "hidden_weight": "hidden_weight", "regress_steps": "regress_steps",
             "markov_lr_mult": "markov_lr_mult", "instrument_every": "instrument_every",
             "gate_core_hours": "gate_core_hours"}
    out.update({key: getattr(args, flag) for key, flag in flags.items() if hasattr(args, flag)})
    early, final = out.pop("early_frac"), out.pop("final_frac")
    out["early_steps"] = getattr(args, "early_steps", int(round(early * args.steps)))
    out["final_steps"] = getattr(args, "final_steps", int(round(final * args.steps)))
    return out


def configs(args):
    """(TrainConfig, DataConfig) from parsed flags."""
    from engine.train.config import TrainConfig
    from engine.train.pipeline import DataConfig

    cfg = TrainConfig(
        out=args.out, variant=args.variant, layout=args.layout, num_layers=args.layers, block_size=args.block_size,
        markov_rank=args.markov_rank, markov_head_type=args.markov_head, taps=args.taps, num_taps=args.num_taps,
        mask_token_id=args.mask_token_id, steps=args.steps, **recipe_values(args),
        early_positions=args.early_positions, hidden_center=args.hidden_center,
        gate_min_match=args.gate_min_match, shortlist=args.shortlist, seq_len=args.seq_len, checkpoint_every=args.checkpoint_every,
        log_every=args.log_every, seed=args.seed, feature_cache=not args.no_feature_cache,
        feature_dtype=args.feature_dtype, eval_max_tokens=args.eval_max_tokens,
        sts_temperature=args.sts_temperature, save_dtype=args.save_dtype,
        tap_scale=args.tap_scale, features_dir=args.features_dir, train_chunks=args.train_chunks,
        grow_every=args.grow_every)
    data = DataConfig(
        text=tuple(args.data), exclude=tuple(args.exclude), chat_prompts=tuple(args.chat_prompts),
        continuations=args.generate_continuations, gen_temperature=args.gen_temperature, gen_batch=args.gen_batch, max_samples=args.max_samples,
        heldout=args.heldout, eval_prompts=args.eval_prompts, num_eval_prompts=args.num_eval_prompts,
        heldout_prompts=tuple(args.heldout_prompts), heldout_text=args.heldout_text)
    return cfg, data


def run(args) -> int:
    from engine.train import pipeline
    from engine.train.loop import TrainingStopped

    if not args.data and not args.chat_prompts:
        print("error: give training data with --data and/or --chat-prompts", file=sys.stderr)
        return 2
    try:
        cfg, data = configs(args)
        report = pipeline.run(cfg, data, args.model, resume=args.resume, stop_after=args.stop_after,
                              extract_only=args.extract_only)
    except TrainingStopped as exc:
        print(f"paused: {exc}", file=sys.stderr)
        return 0
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.extract_only:
        print(json.dumps(report, indent=1))
        return 0
    if report.get("stopped"):  # the go/no-go gate failed: training.json says why
        print(f"stopped: {report['stopped']}", file=sys.stderr)
        return 3
    print(json.dumps({"out": str(cfg.out), "steps": report["train"]["steps"], "heldout": _summary(report)}, indent=1))
    return 0


def _summary(report: dict) -> dict:
    held = report.get("heldout", {})
    out = {}
    if "greedy" in held:
        out["greedy_tau"] = round(held["greedy"]["tau"], 3)
    if "estimate" in held:
        out["tau_estimate"] = round(held["estimate"]["tau_estimate"], 3)
        out["greedy_tau_estimate"] = round(held["estimate"]["greedy_tau_estimate"], 3)
    if "sts" in held and "ece_after" in held["sts"]:
        for key in ("temperatures", "ece_before", "ece_after", "ece_after_crossfit"):
            if key in held["sts"]:
                out["sts_" + key] = [round(x, 4) for x in held["sts"][key]]
    return out
