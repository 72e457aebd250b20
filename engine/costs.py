"""Measured round-cost curve T(l) for the `auto` draft length, cached per machine and model.

Verifying l drafts costs one target forward over l + 1 tokens plus the drafter's pass; on a CPU
that cost grows with l (about 2.2x at l = 7 with BLIS), so the best cap depends on the machine.
The BLAS thread count that decodes fastest is measured first (`choose_decode_threads`), and the
curve is timed at that count, the one the engine then decodes with.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import time
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from engine.backend import STATE as BLAS
from engine.backend import blas_threads, thread_choices
from engine.loading.default_model import cache_root
from engine.models.drafter import draft_base, draft_rows
from engine.scheduler import CostCurve
from engine.seams import drafter_kind

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


def curve_key(target, drafter, max_len: int) -> str:
    """Cache key: the machine (CPU, cores, BLAS and its thread count, MLX version) and the shapes.

    A round's cost depends on the models' shapes and dtypes, not on their weights or where they
    were loaded from, so the key fingerprints every parameter's name, shape and dtype (a renamed
    or re-trained checkpoint of the same architecture shares its curve).
    """
    parts = [platform.node(), _cpu_name(), str(mx.default_device()), BLAS.name, str(BLAS.threads), mx.__version__,
             _shapes(target.model), str(target.tap_layer_ids), _shapes(_modelled(drafter)), str(max_len), "curve-v3"]
    shortlist = getattr(drafter, "shortlist", None)
    if shortlist is not None:  # a shortlist head costs less per row (absent: the key is as it always was)
        parts.append(f"shortlist={shortlist.shape[0]}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _modelled(drafter):
    """The drafter whose passes cost time: None for no drafter and for lookup drafts, which come
    from a dictionary look-up (engine/lookup.py), so a round costs its verify forward alone."""
    return None if drafter_kind(drafter) in (None, "lookup") else drafter


def _shapes(module) -> str:
    """Every parameter's name, shape and dtype, in a stable order ("none" without a module)."""
    if module is None:
        return "none"
    return ";".join(f"{name}:{tuple(a.shape)}:{a.dtype}" for name, a in sorted(tree_flatten(module.parameters())))


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


def _verify_timer(target, context: int = CONTEXT):
    """``timed(n)``: seconds of one target forward over n new tokens after `context` cached ones."""
    from engine.models.target import trim_cache

    cache = target.make_cache()
    mx.eval(target.forward(mx.array([[1] * context]), cache)[0])

    def timed(n: int) -> float:
        t0 = time.perf_counter()
        mx.eval(target.forward(mx.array([[2] * n]), cache))
        elapsed = time.perf_counter() - t0
        trim_cache(cache, n)
        return elapsed

    return timed


def _draft_timer(drafter):
    """``timed(num)``: seconds of one draft pass proposing `num` tokens, as a fixed-cap round runs it:
    the backbone over the block, one lm_head product over the rows (over the drafter's shortlist
    when it has one, as served), then the Markov bias and a sampled token per row."""
    cfg = drafter.config
    dcache = drafter.make_cache()
    drafter.append_context(mx.zeros((1, CONTEXT, cfg.num_taps * cfg.hidden_size)), dcache)
    block = mx.array([[1] + [cfg.mask_token_id] * (cfg.block_size - 1)])  # [1, B]

    def timed(num: int) -> float:
        t0 = time.perf_counter()
        h = drafter.draft_hidden(drafter.backbone(None, block, dcache))[0]  # [drafts, d]
        rows, prev = draft_base(drafter, h[:num]), 1  # [num, V] (shortlist: [num, S])
        for k in range(num):
            row = draft_rows(drafter, h[k : k + 1], mx.array([prev]), rows[k : k + 1])[0]  # [V], as served
            prev = mx.argmax(row).item()
        return time.perf_counter() - t0

    return timed


def measure_verify(target, max_len: int, context: int = CONTEXT, repeats: int = REPEATS) -> list[float]:
    """Best wall time of a target forward over 1..max_len+1 new tokens after `context` cached ones
    (widths timed round-robin, see `_round_robin_best`)."""
    return _round_robin_best(_verify_timer(target, context), range(1, max_len + 2), repeats)


def measure_plain_step(target, steps: int = 8, repeats: int = REPEATS) -> float:
    """Seconds per token of plain greedy decoding as the engine runs it, pipelined: each step queues
    the next forward before reading its token (`SpecDecoder._plain_step`). Best of `repeats` runs of
    `steps` tokens after CONTEXT cached ones."""
    from engine.models.target import trim_cache

    cache = target.make_cache()
    mx.eval(target.forward(mx.array([[1] * CONTEXT]), cache)[0])

    def launch(ids: mx.array) -> mx.array:
        token = mx.argmax(target.forward(ids, cache)[0][0, -1])
        mx.async_eval(token)
        return token

    def timed(_: int) -> float:
        t0 = time.perf_counter()
        ahead = launch(mx.array([[2]]))
        for _ in range(steps - 1):
            current, ahead = ahead, launch(ahead.reshape(1, 1))
            current.item()
        ahead.item()
        elapsed = time.perf_counter() - t0
        trim_cache(cache, steps)
        return elapsed / steps

    return _round_robin_best(timed, range(1), repeats)[0]


# The thread count must win by this much to replace the loaded default: a tie is noise.
THREADS_MARGIN = 0.03


def choose_decode_threads(target, drafter, max_len: int, repeats: int = 3) -> int | None:
    """The BLAS thread count that runs decode rounds fastest, or None when it cannot be set.

    Each candidate (1 and the loaded count, see `engine.backend.thread_choices`) times the same
    round proxy: verifying 1 and `max_len` drafts plus a full draft pass (none for lookup drafts),
    candidates round-robin.
    The loaded count is kept unless the other is faster by `THREADS_MARGIN`.
    """
    choices = thread_choices()
    if len(choices) < 2:
        return choices[0] if choices else None
    modelled = _modelled(drafter)
    verify = _verify_timer(target)
    draft = _draft_timer(modelled) if modelled is not None else (lambda _: 0.0)

    def round_proxy(i: int) -> float:
        with blas_threads(choices[i]):
            return verify(2) + verify(max_len + 1) + draft(max_len)

    best = _round_robin_best(round_proxy, range(len(choices)), repeats)
    loaded = choices.index(BLAS.threads)
    fastest = min(range(len(choices)), key=best.__getitem__)
    return choices[fastest] if best[fastest] < best[loaded] * (1 - THREADS_MARGIN) else choices[loaded]


def measure_curve(target, drafter, max_len: int) -> CostCurve:
    """Choose the decode thread count, then time target forwards over 1..max_len+1 tokens and the
    drafter's backbone and head at it (zero draft costs for lookup drafts)."""
    threads = choose_decode_threads(target, drafter, max_len)
    modelled = _modelled(drafter)
    with blas_threads(threads):
        fixed, per_token = _drafter_costs(modelled) if modelled is not None else (0.0, 0.0)
        verify = measure_verify(target, max_len)
        plain = measure_plain_step(target)
    return CostCurve(verify_s=verify, draft_fixed_s=fixed, draft_per_token_s=per_token, decode_threads=threads,
                     plain_step_s=plain)


def _drafter_costs(drafter) -> tuple[float, float]:
    """(fixed, per drafted token) seconds, fitted to the time of whole draft passes of 1..max drafts.

    Timing whole passes (see `_draft_timer`), not a lone row, keeps the batched lm_head's
    sub-linear growth in the fit.
    """
    best = _round_robin_best(_draft_timer(drafter), range(1, drafter.config.max_drafts + 1), REPEATS)
    per_token = max(0.0, (best[-1] - best[0]) / (len(best) - 1)) if len(best) > 1 else 0.0
    return max(0.0, best[0] - per_token), per_token


def load_or_measure(target, drafter, model_path: str, drafter_id: str, max_len: int,
                    refresh: bool = False) -> CostCurve:
    """Cached curve for this machine/model/drafter, measured (a few seconds) when absent or `refresh`."""
    path = cache_root() / "costs" / f"{curve_key(target, drafter, max_len)}.json"
    if path.exists() and not refresh:
        raw = json.loads(path.read_text())
        return CostCurve(raw["verify_s"], raw["draft_fixed_s"], raw["draft_per_token_s"], raw.get("meta", {}),
                         raw.get("decode_threads"), raw.get("plain_step_s"))
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
    step = measured.verify_s[0]  # the assumed curve is relative to a lone one-token forward
    verify = [1.0 + row_growth * i for i in range(len(measured.verify_s))]
    return CostCurve(verify_s=verify, draft_fixed_s=measured.draft_fixed_s / step,
                     draft_per_token_s=measured.draft_per_token_s / step,
                     meta={"predicted": True, "row_growth": row_growth})
