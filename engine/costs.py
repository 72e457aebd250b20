"""Measured round-cost curve T(l) for the `auto` draft length, cached per machine and model.

Verifying l drafts costs one target forward over l + 1 tokens plus the drafter's pass; on a CPU
that cost grows with l (about 2.2x at l = 7 with BLIS), so the best cap depends on the machine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import time
from pathlib import Path

import mlx.core as mx

from engine.backend import STATE as BLAS
from engine.loading.default_model import cache_root
from engine.scheduler import CostCurve

log = logging.getLogger(__name__)

CONTEXT = 128  # tokens already in the cache while timing (typical chat context)
REPEATS = 5


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def curve_key(model_path: str, drafter_id: str, max_len: int) -> str:
    """Cache key: machine (CPU, cores, BLAS), model, drafter, dtype and MLX version."""
    parts = [platform.node(), _cpu_name(), str(mx.default_device()), BLAS.name, mx.__version__,
             str(Path(model_path).resolve()), drafter_id, "float32", str(max_len)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _round_robin_best(timed, sizes: range, repeats: int) -> list[float]:
    """Best of ``repeats`` times of ``timed(n)`` per size, sizes taken round-robin (1, 2, ..., 1, 2, ...)
    so a burst of other load on the machine hits every size alike instead of inflating one of them."""
    for n in sizes:
        timed(n)  # warm-up: first shapes pay for allocation
    best = [float("inf")] * len(sizes)
    for _ in range(repeats):
        for i, n in enumerate(sizes):
            best[i] = min(best[i], timed(n))
    return best


def measure_verify(target, max_len: int, context: int = CONTEXT, repeats: int = REPEATS) -> list[float]:
    """Best wall time of a target forward over 1..max_len+1 new tokens after `context` cached ones
    (widths timed round-robin, see `_round_robin_best`)."""
    from engine.models.target import trim_cache

    cache = target.make_cache()
    mx.eval(target.forward(mx.array([[1] * context]), cache)[0])

    def step(n: int) -> float:
        t0 = time.perf_counter()
        mx.eval(target.forward(mx.array([[2] * n]), cache))
        elapsed = time.perf_counter() - t0
        trim_cache(cache, n)
        return elapsed

    return _round_robin_best(step, range(1, max_len + 2), repeats)


def measure_curve(target, drafter, max_len: int) -> CostCurve:
    """Time target forwards over 1..max_len+1 tokens and the drafter's backbone and head."""
    fixed, per_token = _drafter_costs(drafter, target)
    return CostCurve(verify_s=measure_verify(target, max_len), draft_fixed_s=fixed, draft_per_token_s=per_token)


def _drafter_costs(drafter, target) -> tuple[float, float]:
    """(fixed, per drafted token) seconds, fitted to the time of whole draft passes of 1..max drafts.

    Each pass is what a fixed-cap round runs: the backbone over the block, one lm_head product over
    the verified rows, then the Markov bias and a sampled token per row. Timing whole passes (not a
    lone row) keeps the batched lm_head's sub-linear growth in the fit.
    """
    cfg = drafter.config
    dcache = drafter.make_cache()
    drafter.append_context(mx.zeros((1, CONTEXT, cfg.num_taps * cfg.hidden_size)), dcache)
    block = mx.array([[1] + [cfg.mask_token_id] * (cfg.block_size - 1)])  # [1, B]

    def draft(num: int) -> float:
        t0 = time.perf_counter()
        h = drafter.draft_hidden(drafter.backbone(None, block, dcache))[0]  # [drafts, d]
        rows, prev = drafter.base_logits(h[:num]), 1  # [num, V]
        for k in range(num):
            row = rows[k] + drafter.markov_bias(mx.array([prev]))[0] if drafter.has_markov else rows[k]
            prev = mx.argmax(row).item()
        return time.perf_counter() - t0

    best = _round_robin_best(draft, range(1, cfg.max_drafts + 1), REPEATS)
    per_token = max(0.0, (best[-1] - best[0]) / (len(best) - 1)) if len(best) > 1 else 0.0
    return max(0.0, best[0] - per_token), per_token


def load_or_measure(target, drafter, model_path: str, drafter_id: str, max_len: int,
                    refresh: bool = False) -> CostCurve:
    """Cached curve for this machine/model/drafter, measured (a few seconds) when absent or `refresh`."""
    path = cache_root() / "costs" / f"{curve_key(model_path, drafter_id, max_len)}.json"
    if path.exists() and not refresh:
        raw = json.loads(path.read_text())
        return CostCurve(raw["verify_s"], raw["draft_fixed_s"], raw["draft_per_token_s"], raw.get("meta", {}))
    log.info("measuring the round-cost curve for auto draft length (once per machine and model)")
    curve = measure_curve(target, drafter, max_len)
    curve.meta = {"model": model_path, "drafter": drafter_id, "blas": BLAS.name, "mlx": mx.__version__}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(curve.__dict__, indent=2))
    tmp.replace(path)
    return curve


# Assumed, not measured: on Apple Silicon (Metal) batch-1 decoding is bound by reading the weights,
# so a verify pass over l + 1 rows costs about one decode step plus a little per row while l is small.
FLAT_ROW_GROWTH = 0.03


def flat_verify_curve(measured: CostCurve, row_growth: float = FLAT_ROW_GROWTH) -> CostCurve:
    """A *predicted* curve for a bandwidth-bound device, in units of one decode step.

    Verify cost is assumed to be 1 + row_growth * l; the drafter's costs relative to one decode step
    are taken from `measured` (on a CPU with a fast BLAS, m = 1 decoding is bandwidth-bound too).
    """
    step = measured.verify_s[0]
    verify = [1.0 + row_growth * i for i in range(len(measured.verify_s))]
    return CostCurve(verify_s=verify, draft_fixed_s=measured.draft_fixed_s / step,
                     draft_per_token_s=measured.draft_per_token_s / step,
                     meta={"predicted": True, "row_growth": row_growth})
