"""Logit processing, sampling and the lossless accept rules for speculative decoding.

Vocabulary (see `engine/api.py`): a round verifies `l` *draft* tokens against `l + 1` target rows;
the first `n` drafts are *accepted*; the round then emits one more token, either *recovered*
(sampled from the residual at the first rejection) or the *bonus* (sampled from the last target
row when all `l` drafts were accepted).

Three accept rules share one logit pipeline, `process_logits`, so plain and speculative decoding
sample from exactly the same distribution:

* `greedy_accept`: temperature ~0, accept while the draft equals the target argmax.
* `rejection_accept`: the Leviathan/Chen rule (arXiv 2211.17192, arXiv 2302.01318).
* `seed_stable_accept`: Gumbel-max with noise keyed by (seed, absolute position), so a given seed
  emits the same tokens whatever the draft length. Lossless, lower acceptance than rejection.

Randomness always comes from explicit keys (`mix_key`); nothing here reads or advances the global
MLX random state. Everything is float32.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import mlx.core as mx

# Temperatures at or below this are treated as greedy (as mlx-lm and vLLM do).
GREEDY_TEMPERATURE = 1e-5

# A residual with less mass than this is float32 rounding of p - q (p == q numerically); sampling
# p instead changes the output distribution by at most this much in total variation.
MIN_RESIDUAL_MASS = 1e-6

# Distinct counter for the Gumbel stream, so seed-stable noise never collides with other keys
# derived from the same (seed, position).
_GUMBEL_STREAM = 0x67756D62  # "gumb"

# Partial-sort width tried first for top-p (see `_apply_top_p`).
_TOP_P_CANDIDATES = 1024

# Block width of the two-stage sum behind reported logprobs (see `_blocked_logsumexp`).
_LSE_BLOCK = 256

_MASK64 = (1 << 64) - 1
_NEG_INF = float("-inf")


@dataclass(frozen=True)
class SamplerSettings:
    """Per-request logit processing, applied identically to drafter and target logits."""

    temperature: float = 0.0  # <= GREEDY_TEMPERATURE means greedy
    top_p: float = 1.0  # nucleus mass in [0, 1]; 1 = off
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    min_p: float = 0.0  # drop tokens with prob < min_p * max prob; 0 = off

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax instead of sampling."""
        return self.temperature <= GREEDY_TEMPERATURE


# ---------------------------------------------------------------------------------------------
# Logit processing


def process_logits(logits: mx.array, s: SamplerSettings) -> mx.array:
    """Turn logits [..., V] into float32 log-probabilities [..., V] of what plain decoding samples.

    Order: divide by temperature, then top-k, then top-p, then min-p; removed tokens get -inf and
    the rest is renormalised. Ties at a top-k or top-p cut-off are all kept, so the result does
    not depend on sort order. Greedy settings give the one-hot distribution at the argmax (log 0
    there, -inf elsewhere), which makes every accept rule reduce to greedy verification.
    Speculative and plain decoding must both call this so they share one distribution.
    With top-p < 1 this synchronises once (see `_apply_top_p`).
    """
    if s.greedy:
        return _one_hot_logprobs(logits)
    x = logits.astype(mx.float32) / s.temperature  # [..., V]
    if 0 < s.top_k < x.shape[-1]:
        x = _apply_top_k(x, s.top_k)
    if s.top_p < 1.0:
        x = _apply_top_p(x, s.top_p)
    if s.min_p > 0.0:
        x = _apply_min_p(x, s.min_p)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def _one_hot_logprobs(logits: mx.array) -> mx.array:
    top = mx.argmax(logits, axis=-1, keepdims=True)  # [..., 1]
    hot = mx.arange(logits.shape[-1]) == top  # [..., V]
    return mx.where(hot, 0.0, _NEG_INF).astype(mx.float32)


def _apply_top_k(x: mx.array, k: int) -> mx.array:
    # x: [..., V]; keep everything >= the k-th largest value (a partition, not a full sort).
    kth = mx.topk(x, k, axis=-1).min(axis=-1, keepdims=True)  # [..., 1]
    return mx.where(x >= kth, x, _NEG_INF)


def _apply_top_p(x: mx.array, top_p: float) -> mx.array:
    # A full sort of V = 49k costs ~4 ms per row on CPU, 10x a partial top-m. The nucleus
    # nearly always lies inside the top _TOP_P_CANDIDATES, so try those first and sort the
    # whole row only when they are not enough. Same cut-off either way.
    logz = mx.logsumexp(x, axis=-1, keepdims=True)  # [..., 1]
    vocab = x.shape[-1]
    for num_candidates in (_TOP_P_CANDIDATES, vocab):
        m = min(num_candidates, vocab)
        top = -mx.sort(-mx.topk(x, m, axis=-1), axis=-1)  # [..., m], descending
        # Keep the sorted prefix whose mass *before* each token is < top_p: this includes the
        # token that crosses top_p, and the top token always (its preceding mass is 0).
        before = mx.cumsum(mx.exp(top - logz), axis=-1, inclusive=False)  # [..., m]
        inside = before < top_p  # [..., m]
        if m == vocab or not inside[..., -1].any().item():
            break
    num_kept = mx.maximum(inside.sum(axis=-1, keepdims=True), 1)  # [..., 1]
    cutoff = mx.take_along_axis(top, num_kept - 1, axis=-1)  # [..., 1]
    return mx.where(x >= cutoff, x, _NEG_INF)


def _apply_min_p(x: mx.array, min_p: float) -> mx.array:
    # p < min_p * p_max  <=>  x - x_max < log(min_p): no softmax needed.
    floor = mx.max(x, axis=-1, keepdims=True) + math.log(min_p)  # [..., 1]
    return mx.where(x >= floor, x, _NEG_INF)


# ---------------------------------------------------------------------------------------------
# Keys and plain sampling


def _splitmix64(x: int) -> int:
    # splitmix64 finaliser (Steele, Lea, Flood 2014): a bijection on 64-bit ints that spreads
    # every input bit over the output, so consecutive counters give unrelated keys.
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def mix_key(seed: int, *counters: int) -> mx.array:
    """Counter-based PRNG key for (seed, *counters), e.g. (request seed, round, position).

    The mix is pure Python, so the same arguments always give the same key and the global MLX
    random state is never read or advanced. Returns an `mx.random.key` ([2] uint32).
    """
    h = _splitmix64(seed & _MASK64)
    for c in counters:
        h = _splitmix64(h ^ (c & _MASK64))
    return mx.random.key(h)


def categorical_token(logprobs: mx.array, key: mx.array) -> mx.array:
    """One token id drawn from log-probabilities [V], as a lazy scalar array (`.item()` reads it)."""
    return mx.random.categorical(logprobs, key=key)


def sample_draft(
    logits: mx.array, s: SamplerSettings, key: mx.array
) -> tuple[int, mx.array | None]:
    """Sample one draft token from q = process_logits(logits, s).

    `logits` [V] must already include anything that shapes the draft distribution (the DSpark
    Markov bias). Returns (token, logq [V]); keep logq for `rejection_accept`, which is lossless
    only if it gets exactly the q the token was drawn from. Greedy settings return (argmax, None).
    """
    if s.greedy:
        return mx.argmax(logits, axis=-1).item(), None
    logq = process_logits(logits, s)  # [V]
    return categorical_token(logq, key).item(), logq


def point_mass_logprobs(token_ids: list[int], vocab: int) -> mx.array:
    """log q [l, V] of drafts fixed by the context rather than sampled (prompt lookup): a point mass
    on each draft, 0 at its token and -inf elsewhere.

    With `rejection_accept` a draft x is then accepted with probability p(x), and a rejection emits
    from `residual_probs(p, q)` = p with x removed, renormalised. No NaN arises: exp(-inf) is 0.
    """
    ids = mx.array(token_ids)[:, None]  # [l, 1]
    floor = mx.full((len(token_ids), vocab), _NEG_INF, dtype=mx.float32)  # [l, V]
    # A scatter of l zeros: 6x faster than comparing every id against the vocabulary (V = 49k).
    return mx.put_along_axis(floor, ids, mx.zeros((len(token_ids), 1), dtype=mx.float32), axis=-1)


# ---------------------------------------------------------------------------------------------
# Accept rules


def greedy_accept(draft_ids: list[int], target_logits: mx.array) -> tuple[int, int]:
    """Greedy verification: accept while draft_ids[k] == argmax(target_logits[k]).

    `target_logits` [l+1, V] (raw logits suffice: no softmax is taken). Returns
    (num_accepted, next_token), where next_token is the argmax of row num_accepted: the
    correction at the first mismatch, or the bonus when every draft matched.
    """
    target_ids = mx.argmax(target_logits, axis=-1).tolist()  # one sync for all l+1 rows
    n = _matching_prefix(draft_ids, target_ids)
    return n, target_ids[n]


def _matching_prefix(draft_ids: list[int], target_ids: list[int]) -> int:
    n = 0
    while n < len(draft_ids) and draft_ids[n] == target_ids[n]:
        n += 1
    return n


def rejection_accept(
    draft_ids: list[int],
    draft_logprobs: mx.array | None,
    target_logprobs: mx.array,
    key: mx.array,
) -> tuple[int, int]:
    """Lossless speculative sampling (Leviathan et al., arXiv 2211.17192, Alg. 1 and App. A.1).

    `draft_logprobs` [l, V] are log q_k, the exact distributions the drafts were sampled from
    (None when l == 0; rows past l are ignored, so a truncated draft can pass all its rows).
    `target_logprobs` [l+1, V] are log p_k after `process_logits`.

    Draft k is accepted with probability min(1, p_k(x_k) / q_k(x_k)), using uniforms from `key`.
    At the first rejection the round emits a recovered token from `residual_probs(p_k, q_k)`; if
    all l drafts pass it emits a bonus token from p_l (`_bonus`). Two syncs per call: the accept
    flags, then the emitted token. Returns (num_accepted, next_token).
    """
    accept_key, sample_key = mx.random.split(key, 2)
    n = _num_accepted(draft_ids, draft_logprobs, target_logprobs, accept_key)
    if n == len(draft_ids):
        return n, _bonus(draft_ids, draft_logprobs, target_logprobs, sample_key)
    return n, _recover(target_logprobs[n], draft_logprobs[n], sample_key)


def _num_accepted(
    draft_ids: list[int],
    draft_logprobs: mx.array | None,
    target_logprobs: mx.array,
    key: mx.array,
) -> int:
    """Length of the accepted prefix, with one uniform per draft drawn from `key`."""
    num_draft = len(draft_ids)
    if num_draft == 0:
        return 0
    ids = mx.array(draft_ids)[:, None]  # [l, 1]
    logp = mx.take_along_axis(target_logprobs[:num_draft], ids, axis=-1)[:, 0]  # [l]
    logq = mx.take_along_axis(draft_logprobs[:num_draft], ids, axis=-1)[:, 0]  # [l]
    u = mx.random.uniform(shape=(num_draft,), key=key)  # [l]
    # u < p/q in log space avoids underflow; NaN (p = q = 0) compares False, i.e. reject.
    accepted = (mx.log(u) < logp - logq).tolist()  # one sync for the whole block
    return accepted.index(False) if False in accepted else num_draft


def _recover(logp: mx.array, logq: mx.array, key: mx.array) -> int:
    # logp, logq: [V]; sample the recovered token from norm(max(0, p - q)).
    residual = residual_probs(mx.exp(logp), mx.exp(logq))  # [V]
    return categorical_token(mx.log(residual), key).item()


def _bonus(
    draft_ids: list[int],
    draft_logprobs: mx.array | None,
    target_logprobs: mx.array,
    key: mx.array,
) -> int:
    """All drafts accepted: the bonus token is an exact sample of the last target row p_l.

    Takes the full round so a test can swap in wrong variants (resample from q, repeat a draft).
    """
    return categorical_token(target_logprobs[len(draft_ids)], key).item()


def residual_probs(p: mx.array, q: mx.array) -> mx.array:
    """Residual distribution norm(max(0, p - q)) for probabilities p, q [..., V].

    Falls back to p where the residual mass is below MIN_RESIDUAL_MASS, which happens only when
    p == q up to float32 rounding (and then a rejection is a ~zero-probability event anyway).
    """
    residual = mx.maximum(p - q, 0.0)  # [..., V]
    mass = residual.sum(axis=-1, keepdims=True)  # [..., 1]
    ok = mass > MIN_RESIDUAL_MASS
    return mx.where(ok, residual / mx.where(ok, mass, 1.0), p)


# ---------------------------------------------------------------------------------------------
# Seed-stable sampling: Gumbel-max with noise fixed by (seed, absolute position)


# A round draws noise for the same positions twice (draft, then verify) and re-verifies the
# positions after a mismatch, and V Gumbel draws cost ~0.7 ms on CPU; 32 rows are ~6 MB.
@functools.lru_cache(maxsize=32)
def gumbel_noise(seed: int, position: int, vocab: int) -> mx.array:
    """Standard Gumbel noise [vocab] for one absolute position; same arguments, same noise.

    Results are cached and shared, so callers must not modify the returned array in place.
    """
    return mx.random.gumbel(shape=(vocab,), key=mix_key(seed, position, _GUMBEL_STREAM))


def seed_stable_token(target_logprobs_row: mx.array, seed: int, position: int) -> mx.array:
    """The token at `position` as argmax(logp + g(seed, position)), an exact draw from p; a lazy
    scalar array (`.item()` reads it)."""
    vocab = target_logprobs_row.shape[-1]
    return mx.argmax(target_logprobs_row + gumbel_noise(seed, position, vocab))


def seed_stable_accept(
    draft_ids: list[int], target_logprobs: mx.array, seed: int, first_position: int
) -> tuple[int, int]:
    """Seed-stable verification: accept while each draft equals the target's seed-stable sample.

    `target_logprobs` [l+1, V]; row k is the distribution of the token at absolute position
    first_position + k. The target token of row k is `seed_stable_token(row k, seed, position)`,
    so the emitted tokens are exactly what plain seed-stable decoding emits for this seed, for any
    draft and any draft length. Returns (num_accepted, next_token).
    """
    num_rows, vocab = target_logprobs.shape
    noise = mx.stack(
        [gumbel_noise(seed, first_position + k, vocab) for k in range(num_rows)]
    )  # [l+1, V]
    target_ids = mx.argmax(target_logprobs + noise, axis=-1).tolist()  # one sync
    n = _matching_prefix(draft_ids, target_ids)
    return n, target_ids[n]


def seed_stable_draft(logits: mx.array, s: SamplerSettings, seed: int, position: int) -> int:
    """Draft token for `position` using the same Gumbel noise as the target.

    argmax(process_logits(logits, s) + g(seed, position)) is an exact sample of q that coincides
    with the target's token whenever q ~ p. The draft only affects speed, never the output.
    """
    logq = process_logits(logits, s)  # [V]
    return mx.argmax(logq + gumbel_noise(seed, position, logq.shape[-1])).item()


# ---------------------------------------------------------------------------------------------
# Logprobs reported to clients


def token_logprobs(
    rows: mx.array, tokens: list[int], top_n: int
) -> list[tuple[float, list[tuple[int, float]]]]:
    """Raw log-softmax of target rows [m, V] at tokens[i] (row i), with each row's top_n alternatives.

    Raw means before any processor, temperature or truncation (vLLM's and OpenAI's default).
    Returns [(logprob, [(id, logprob)] * top_n most likely first)] per token; one sync.
    """
    logp = rows.astype(mx.float32)
    logp = logp - _blocked_logsumexp(logp)  # [m, V]
    chosen = mx.take_along_axis(logp, mx.array(tokens)[:, None], axis=-1)[:, 0]  # [m]
    n = min(top_n, logp.shape[-1])
    if n <= 0:
        return [(lp, []) for lp in chosen.tolist()]
    # A partition finds the n largest without sorting V; only those n are then sorted.
    ids = mx.argpartition(-logp, kth=n - 1, axis=-1)[:, :n]  # [m, n] unordered
    vals = mx.take_along_axis(logp, ids, axis=-1)  # [m, n]
    order = mx.argsort(-vals, axis=-1)  # [m, n]
    ids, vals = mx.take_along_axis(ids, order, axis=-1), mx.take_along_axis(vals, order, axis=-1)
    mx.eval(chosen, ids, vals)
    return [(c, list(zip(i, v))) for c, i, v in zip(chosen.tolist(), ids.tolist(), vals.tolist())]


def _blocked_logsumexp(x: mx.array) -> mx.array:
    """logsumexp over the last axis of x [m, V] -> [m, 1], summed in blocks of _LSE_BLOCK.

    One float32 pass over 49k terms (mx.logsumexp) is up to ~2e-4 off on real logits; summing
    blocks first keeps the error near 1e-6, so reported logprobs match a float64 reference.
    """
    top = mx.max(x, axis=-1, keepdims=True)  # [m, 1]
    e = mx.exp(x - top)  # [m, V]
    pad = (-e.shape[-1]) % _LSE_BLOCK
    if pad:
        e = mx.pad(e, [(0, 0), (0, pad)])  # zeros: the padding adds no mass
    partial = e.reshape(e.shape[0], -1, _LSE_BLOCK).sum(axis=-1)  # [m, V / block]
    return top + mx.log(partial.sum(axis=-1, keepdims=True))  # [m, 1]
