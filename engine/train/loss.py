"""DSpark training losses (spec §1.9, Eq. 9-12), over the valid draft rows of a `BlockBatch`.

Per valid draft row (weight w_k = exp(-(k-1)/decay), each term a w-weighted mean):
    q_k    = softmax(U_k + B(x_{k-1}))   draft distribution, teacher-forced Markov bias
    p_k    = softmax(lm_head_target(hidden[a+k-1]))
    L_ce   = -log q_k(x_{a+k})
    L_tv   = ||q_k - p_k||_1
    c*_k   = 1 - L_tv / 2 = sum_v min(q_k, p_k)    (detached, clipped to [0, 1])
    L_conf = BCE-with-logits(z_k, c*_k)           z_k = confidence logit from [h_k ; W1[x_{k-1}]]
    L      = a_ce L_ce + a_tv L_tv + a_conf L_conf  (0.1 / 0.9 / 1.0 for DSpark; 1 / 0 / 0 for DFlash)
c*_k is the analytic acceptance probability of draft k at T = 1 given an accepted prefix; its
per-position mean and 1 + sum_j prod_{i<=j} c*_i (per block) are the training-time estimates of
acceptance and tau that DeepSpec logs. The same estimate with c*_k replaced by 1[argmax q_k ==
argmax p_k] estimates greedy acceptance (exact on target-generated greedy data).
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import numpy as np

from engine.models.drafter import Drafter, draft_logits
from engine.train.batch import BlockBatch

HeadFn = Callable[[mx.array], mx.array]
_LOG2E = 1.4426950408889634


def fast_exp(x: mx.array) -> mx.array:
    """exp(x) as 2 ** (x log2 e): same fp32 result (rel. error ~1e-7), about twice as fast as
    ``mx.exp`` on the mlx-cpu wheel, where a vocabulary-wide exp costs as much as a large matmul."""
    return mx.power(2.0, x * _LOG2E)


def softmax_and_logz(logits: mx.array) -> tuple[mx.array, mx.array]:
    """(probs [R, V], log-partition [R, 1]) with a single exp pass over the vocabulary.

    This replaces the usual logsumexp + exp (and the exp that logsumexp's backward recomputes) by
    one exp whose output the backward reuses. The max is a constant shift: it carries no gradient.
    """
    shift = mx.stop_gradient(logits.max(axis=-1, keepdims=True))
    e = fast_exp(logits - shift)
    total = e.sum(axis=-1, keepdims=True)
    return e / total, shift + mx.log(total)


def block_losses(drafter: Drafter, target_head: HeadFn, h_rows: mx.array, batch: BlockBatch,
                 alphas: tuple[float, float, float], with_target: bool) -> tuple[mx.array, dict]:
    """(total loss, parts) for h_rows [R, d]; parts has ce/tv/conf scalars and [R] row stats.

    ``with_target`` computes p_k (needed by TV and the confidence head; optional for a CE-only
    variant, which then reports no acceptance estimate).
    """
    a_ce, a_tv, a_conf = alphas
    w = batch.weights
    wsum = w.sum()
    logits = draft_logits(drafter, h_rows, batch.prev_ids)  # [R, V]: the distribution the engine samples
    q, logz = softmax_and_logz(logits)
    ce_rows = logz[:, 0] - mx.take_along_axis(logits, batch.labels[:, None], axis=-1)[:, 0]  # -log q(label)
    parts = {"ce": (w * ce_rows).sum() / wsum}
    total = a_ce * parts["ce"]
    if not with_target:
        return total, parts
    # Overlapping blocks share target rows (row t serves draft k of anchor t-k+1 for every k), so
    # the vocabulary-wide head and softmax run once per distinct row, then gather.
    hidden = batch.hidden.reshape(-1, batch.hidden.shape[-1])[batch.target_unique]  # [U, d]
    target_logits = target_head(hidden).astype(mx.float32)  # [U, V]
    p = softmax_and_logz(target_logits)[0][batch.target_inverse]  # [R, V]
    target_argmax = mx.argmax(target_logits, axis=-1)[batch.target_inverse]  # [R]
    # Without a TV term, keep q out of the backward graph (monitoring only).
    tv_rows = mx.abs((q if a_tv > 0 else mx.stop_gradient(q)) - p).sum(axis=-1)  # [R]
    cstar = mx.stop_gradient(mx.clip(1.0 - 0.5 * tv_rows, 0.0, 1.0))
    # Greedy acceptance of the row: the draft argmax equals the target argmax.
    match = mx.stop_gradient(mx.argmax(logits, axis=-1) == target_argmax).astype(mx.float32)
    parts.update(tv=(w * tv_rows).sum() / wsum, cstar=cstar, greedy_match=match)
    if a_tv > 0:
        total = total + a_tv * parts["tv"]
    if drafter.has_confidence:
        z = drafter.confidence_logits(h_rows, batch.prev_ids)  # [R]
        bce = mx.logaddexp(mx.zeros_like(z), z) - cstar * z  # BCE with logits against soft label c*
        parts.update(conf=(w * bce).sum() / wsum, conf_prob=mx.sigmoid(z))
        if a_conf > 0:
            total = total + a_conf * parts["conf"]
    return total, parts


def acceptance_estimate(cstar: np.ndarray, position: np.ndarray, block: np.ndarray, num_blocks: int,
                        num_drafts: int) -> tuple[list[float], float]:
    """(mean c*_k per position, tau estimate = mean over blocks of 1 + sum_j prod_{i<=j} c*_i)."""
    grid = np.zeros((num_blocks, num_drafts), dtype=np.float64)  # invalid rows count as rejected
    grid[block, position] = cstar
    counts = np.bincount(position, minlength=num_drafts)
    sums = np.bincount(position, weights=cstar, minlength=num_drafts)
    per_pos = [float(s / c) if c else 0.0 for s, c in zip(sums, counts)]
    used = np.zeros(num_blocks, dtype=bool)
    used[block] = True
    tau = 1.0 + np.cumprod(grid[used], axis=1).sum(axis=1)
    return per_pos, float(tau.mean()) if tau.size else 1.0
