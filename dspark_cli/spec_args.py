"""Model and speculative-decoding flags shared by `generate`, `serve` and `bench`."""

from __future__ import annotations

import argparse
import os


def max_draft_value(text: str) -> int | str:
    """`auto` or a positive integer."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a positive integer or 'auto'") from None
    if value < 1:
        raise argparse.ArgumentTypeError("expected a positive integer or 'auto'")
    return value


def add_spec_args(p: argparse.ArgumentParser) -> None:
    """--model, --precision, --drafter, --mode, --sampler, --max-draft, --confidence-threshold, --drafter-quantization,
    --lookup-min-ngram, --lookup-history."""
    env = os.environ.get
    p.add_argument("--model", default=env("DSPARK_MODEL"),
                   help="mlx-lm model directory or Hugging Face id; default: embedded SmolLM2-135M-Instruct [env DSPARK_MODEL]")
    p.add_argument("--precision", choices=["auto", "float32", "stored"], default=env("DSPARK_PRECISION", "auto"),
                   help="the embedded default model's weights: the 4/8-bit tensors its GGUF stores (stored), or "
                        "float32; auto: stored where the native kernel (docs/native.md) or a GPU multiplies them "
                        "fast, else float32 [env DSPARK_PRECISION]")
    p.add_argument("--drafter", default=env("DSPARK_DRAFTER"),
                   help="drafter directory or Hugging Face id; default: the shipped/published one [env DSPARK_DRAFTER]")
    p.add_argument("--mode", choices=["dspark", "dflash", "lookup", "hybrid", "auto", "baseline"],
                   default=env("DSPARK_MODE", "dspark"),
                   help="decoding mode: a trained drafter (dspark, dflash), drafts copied from the prompt and output "
                        "(lookup), the trained drafter or lookup, whichever pays more, chosen each round (hybrid), "
                        "a trained drafter when one is known else lookup (auto), or none (baseline) "
                        "[env DSPARK_MODE]")
    p.add_argument("--sampler", choices=["rejection", "seed-stable"], default=env("DSPARK_SAMPLER", "rejection"),
                   help="lossless sampler for temperature > 0 [env DSPARK_SAMPLER]")
    p.add_argument("--max-draft", type=max_draft_value, default=max_draft_value(env("DSPARK_MAX_DRAFT", "auto")),
                   help="drafts verified per round: N or auto (measured cost model) [env DSPARK_MAX_DRAFT]")
    p.add_argument("--confidence-threshold", type=float, default=_float(env("DSPARK_CONFIDENCE_THRESHOLD")),
                   help="stop drafting when the prefix survival falls below this [env DSPARK_CONFIDENCE_THRESHOLD]")
    p.add_argument("--drafter-quantization", choices=["bf16", "8bit", "4bit"], default=env("DSPARK_DRAFTER_QUANTIZATION"),
                   help="quantize the drafter (lossless; may change acceptance) [env DSPARK_DRAFTER_QUANTIZATION]")
    p.add_argument("--lookup-min-ngram", type=_min_ngram, metavar="N", default=_min_ngram(env("DSPARK_LOOKUP_MIN_NGRAM", "2")),
                   help="lookup drafts after a context match of 3 tokens, else of down to N (default: 2) "
                        "[env DSPARK_LOOKUP_MIN_NGRAM]")
    p.add_argument("--lookup-history", type=_tokens, metavar="TOKENS", default=_tokens(env("DSPARK_LOOKUP_HISTORY", "0")),
                   help="lookup and hybrid also draft from the last TOKENS tokens of earlier requests' outputs "
                        "(default: 0, off: it makes one caller's timing depend on another's outputs) "
                        "[env DSPARK_LOOKUP_HISTORY]")


def _int_at_least(lower: int, what: str):
    """An argparse type: an integer >= `lower`, else an error that says `what` was expected."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}") from None
        if value < lower:
            raise argparse.ArgumentTypeError(f"expected {what}")
        return value
    return parse


# The shortest context match lookup drafts from; a token budget (0: off).
_min_ngram = _int_at_least(1, "a positive integer")
_tokens = _int_at_least(0, "a token count >= 0")


def _float(text: str | None) -> float | None:
    return None if text in (None, "") else float(text)


def engine_config(args, max_queue: int = 16):
    """EngineConfig from parsed flags."""
    from engine.api import EngineConfig, SpecConfig

    spec = SpecConfig(mode=args.mode, drafter=args.drafter, max_draft=args.max_draft,
                      confidence_threshold=args.confidence_threshold, sampler=args.sampler,
                      drafter_quantization=args.drafter_quantization, lookup_min_ngram=args.lookup_min_ngram,
                      lookup_history=args.lookup_history)
    return EngineConfig(model=args.model, precision=args.precision, spec=spec, max_queue=max_queue)
