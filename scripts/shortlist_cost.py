"""Time a draft pass with and without a draft-vocabulary shortlist, against a plain decode step.

    python scripts/shortlist_cost.py [--shortlist 8192] [--drafts 7] [--repeats 15] [--threads 1]

On the default model (SmolLM2-135M-Instruct) with untrained drafters of the shipped geometry
(`train-drafter`'s defaults: 2 layers, block 7, Markov rank 64, SmolLM2's embedding and lm_head),
DeepSpec and z-lab layouts, each with the whole vocabulary and with a shortlist of the given size
(the lowest ids: only the size matters for the time). Each draft pass is `engine.costs._draft_timer`,
the path the cost curve and serving take; the plain step is `measure_plain_step`. Medians over
--repeats, all at --threads BLAS threads. docs/performance.md records the result.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path


def _drafter(variant: str, model, mask_id: int):
    from engine.train.config import TrainConfig, make_drafter_config
    from engine.train.model import init_drafter

    cfg = TrainConfig(out=Path(tempfile.gettempdir()) / "shortlist-cost", variant=variant)
    return init_drafter(make_drafter_config(cfg, model, mask_id), model, seed=0)


def _median_ms(timed, arg, repeats: int) -> float:
    timed(arg)  # warm-up: first shapes pay for allocation
    return round(statistics.median(timed(arg) for _ in range(repeats)) * 1e3, 3)


def main() -> None:
    """Print (and return) the medians and their ratios to a plain decode step as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shortlist", type=int, default=8192)
    parser.add_argument("--drafts", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import engine  # noqa: F401  (the fast BLAS must load before mlx.core)
    import mlx.core as mx

    from engine import costs
    from engine.backend import STATE as BLAS
    from engine.backend import blas_threads, measure_sgemm_gflops
    from engine.loading.target import load_target
    from engine.models.target import Target

    model, _, _ = load_target(None)
    vocab = model.args.vocab_size
    target = Target(model)
    out = {"blas": BLAS.name, "sgemm_gflops": round(measure_sgemm_gflops(), 1), "threads": args.threads,
           "mlx": mx.__version__, "drafts": args.drafts,
           "shortlist": args.shortlist, "repeats": args.repeats}
    with blas_threads(args.threads):
        step = round(costs.measure_plain_step(target, repeats=args.repeats) * 1e3, 3)
        out["plain_step_ms"] = step
        for variant in ("dspark", "dflash"):
            drafter = _drafter(variant, model, vocab - 1)
            for name, ids in (("whole", None), ("shortlist", mx.arange(args.shortlist, dtype=mx.int32))):
                drafter.set_shortlist(ids)
                ms = _median_ms(costs._draft_timer(drafter), args.drafts, args.repeats)
                out[f"{variant}_{name}_ms"] = ms
                out[f"{variant}_{name}_per_step"] = round(ms / step, 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
