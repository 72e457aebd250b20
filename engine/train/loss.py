"""DSpark training losses (docs/method.md §8), over the valid draft rows of a `BlockBatch`.

Per valid draft row (weight w_k = exp(-(k-1)/decay), each term a w-weighted mean):
    q_k    = softmax(U_k + B(x_{k-1}))   draft distribution, teacher-forced Markov bias
    p_k    = softmax(lm_head_target(hidden[a+k-1]))
    L_ce   = -log q_k(x_{a+k})
    L_tv   = ||q_k - p_k||_1
    c*_k   = 1 - L_tv / 2 = sum_v min(q_k, p_k)    (detached, clipped to [0, 1])
    L_conf = BCE-with-logits(z_k, c*_k)           z_k = confidence logit from [h_k ; W1[x_{k-1}]]
    L      = a_ce L_ce + a_tv L_tv + a_conf L_conf  (0.1 / 0.9 / 1.0 for DSpark; 1 / 0 / 0 for DFlash)
Distillation objective (the v2 recipe; the target's top-k cached per row, see `features.py`):
    L_kd   = KL(p || q) over the buckets {target top-k} ∪ {label} ∪ {rest of the vocabulary}
    L_hid  = 1 - cos(h_k, hidden[a+k-1])          the drafter's final state against the target's
Both are exactly zero when the drafter's distribution (resp. state) equals the target's.
With a draft shortlist (`engine.train.shortlist`) L_kd is the same KL with q renormalised over the
batch's columns {shortlist ∪ top-k ∪ labels} instead of the whole vocabulary.
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
from engine.train.batch import BlockBatch, Teacher

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


_REST_FLOOR = 1e-6  # smallest "rest of the vocabulary" mass: keeps log q_rest finite


def kd_rows(logits: mx.array, logz: mx.array, labels: mx.array, teacher: Teacher) -> mx.array:
    """Forward KL(p || q) per row [R] over {top-k} ∪ {label} ∪ {rest}.

    logits [R, V] and logz [R, 1] are the drafter's (q = softmax(logits)); labels [R]. The label is
    its own bucket only when it is not among the top-k (no token is counted twice); every other
    token falls in "rest", whose target mass is 1 - (top-k + label), so no [R, V] target is needed.
    Gradients reach every logit through logz and the rest bucket, as in a full-vocabulary KL.
    """
    ids = mx.concatenate([teacher.ids, labels[:, None]], axis=1)  # [R, k+1]
    extra = (teacher.ids != labels[:, None]).all(axis=1)  # [R] the label is a bucket of its own
    logp = mx.concatenate([teacher.logp, teacher.label_logp[:, None]], axis=1)  # [R, k+1]
    keep = mx.concatenate([mx.ones_like(teacher.logp, dtype=mx.bool_), extra[:, None]], axis=1)
    p = mx.where(keep, mx.exp(logp), 0.0)  # [R, k+1]
    logq = mx.take_along_axis(logits, ids, axis=-1) - logz  # [R, k+1]
    q_in = mx.where(keep, mx.exp(logq), 0.0).sum(axis=-1)  # [R]
    p_rest = mx.maximum(1.0 - p.sum(axis=-1), 0.0)  # [R]
    q_rest = mx.maximum(1.0 - q_in, _REST_FLOOR)
    inside = (p * (mx.where(keep, logp, 0.0) - logq)).sum(axis=-1)
    rest = p_rest * (mx.log(mx.maximum(p_rest, _REST_FLOOR)) - mx.log(q_rest))
    return inside + rest


def cosine_rows(h: mx.array, target: mx.array) -> mx.array:
    """1 - cos(h, target) per row [R] for h, target [R, d] (zero rows count as orthogonal)."""
    dot = (h * target).sum(axis=-1)
    norms = mx.sqrt((h * h).sum(axis=-1) * (target * target).sum(axis=-1))
    return 1.0 - dot / mx.maximum(norms, 1e-12)


def kd_losses(drafter: Drafter, h_rows: mx.array, batch: BlockBatch, teacher: Teacher,
              weights: dict[str, float], center: mx.array | None = None) -> tuple[mx.array, dict]:
    """(total, parts) of the distillation objective for h_rows [R, d].

    ``weights`` has "kd" and "hidden" (0 skips the vocabulary-wide head: the regression-only
    warm-up). The hidden term leaves out rows whose target row is position 0 of its sample (the
    attention sink, whose state is unlike any other), and compares both states after subtracting
    ``center`` [d], the target's mean final state: the target's states share one large direction,
    so an uncentred cosine is mostly won by a constant vector (the self-prediction trap again).
    parts also has [R] ``greedy_match``: the draft argmax equals the target's (top-1), the
    teacher-forced greedy acceptance of the row. With ``batch.columns`` (a draft shortlist) the KD,
    the monitoring CE and that match are over those columns only (`engine.train.shortlist`).
    """
    w = batch.weights
    target_h = batch.hidden.reshape(-1, batch.hidden.shape[-1])[batch.target_rows]  # [R, d]
    sink = (batch.target_rows % batch.hidden.shape[1]) == 0  # [R]
    wh = mx.where(sink, 0.0, w)
    c = center if center is not None else mx.zeros((h_rows.shape[-1],))
    cos_rows = cosine_rows(h_rows - c, target_h - c)
    parts = {"hidden": (wh * cos_rows).sum() / mx.maximum(wh.sum(), 1e-12)}
    total = weights.get("hidden", 0.0) * parts["hidden"]
    if weights.get("kd", 0.0) <= 0:
        return total, parts
    labels, vocab = batch.labels, None
    if batch.columns is not None:  # ids become columns of the shortlist: same formulas below
        labels, vocab, teacher = batch.columns.labels, batch.columns.vocab, batch.columns.teacher
    logits = draft_logits(drafter, h_rows, batch.prev_ids, vocab=vocab)  # [R, V] (shortlist: [R, C])
    logz = mx.stop_gradient(logits.max(axis=-1, keepdims=True))
    logz = logz + mx.log(fast_exp(logits - logz).sum(axis=-1, keepdims=True))  # [R, 1]
    parts["kd"] = (w * kd_rows(logits, logz, labels, teacher)).sum() / w.sum()
    ce_rows = logz[:, 0] - mx.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    parts["ce"] = mx.stop_gradient((w * ce_rows).sum() / w.sum())  # monitoring only
    match = mx.argmax(logits, axis=-1) == teacher.ids[:, 0]
    parts["greedy_match"] = mx.stop_gradient(match).astype(mx.float32)
    return total + weights["kd"] * parts["kd"], parts


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
