"""Tests for engine.sampling: logit processing, accept rules and losslessness (docs/method.md §5, §7.2).

Statistical tests use fixed seeds, so they are deterministic. Each distribution check is the same
pair of criteria: Pearson chi-square p-value > ALPHA (cells with expected count < 5 merged) and
TV(p_hat, p) <= 1.5 * sqrt(K / N). Negative controls break the rule on purpose and must fail them.
"""

import math

import numpy as np
import pytest

import engine  # noqa: F401  (loads the fast BLAS; must come before mlx.core)

# isort: split
import mlx.core as mx

from engine import sampling
from engine.sampling import (
    SamplerSettings,
    greedy_accept,
    mix_key,
    process_logits,
    rejection_accept,
    residual_probs,
    sample_draft,
    seed_stable_accept,
    seed_stable_draft,
    seed_stable_token,
)

from tests.stats import assert_detected, assert_fits, chi2_sf

NEG_INF = float("-inf")

# ---------------------------------------------------------------------------------------------
# Statistics helpers


def draw(probs: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Inverse-CDF draws; tolerates float32 probabilities that sum to 1 only approximately."""
    cdf = np.cumsum(np.asarray(probs, dtype=np.float64))
    return np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right")


def dirichlet(vocab: int, rng: np.random.Generator, alpha: float = 0.7) -> np.ndarray:
    """A random float32 distribution over `vocab` tokens."""
    p = rng.dirichlet(np.full(vocab, alpha)).astype(np.float32)
    return p / p.sum()


def logs(probs) -> mx.array:
    """float32 log-probabilities as an mx.array (log 0 = -inf)."""
    with np.errstate(divide="ignore"):
        return mx.array(np.log(np.asarray(probs, dtype=np.float32)))


def test_chi2_sf_matches_tabulated_critical_values():
    """The local chi-square survival function reproduces textbook 5% / 0.1% critical values."""
    table = [(3.841459, 1, 0.05), (5.991465, 2, 0.05), (11.070498, 5, 0.05),
             (18.307038, 10, 0.05), (29.588298, 10, 0.001), (31.410433, 20, 0.05)]
    for stat, dof, sf in table:
        assert chi2_sf(stat, dof) == pytest.approx(sf, rel=1e-5)


# ---------------------------------------------------------------------------------------------
# 1. process_logits


def np_process(logits, temperature, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    """Independent float64 reference for process_logits, one row at a time."""
    rows = []
    for row in np.atleast_2d(np.asarray(logits, dtype=np.float64)):
        x = row / temperature
        if 0 < top_k < len(x):
            x = np.where(x >= np.sort(x)[::-1][top_k - 1], x, -np.inf)
        if top_p < 1.0:
            order = np.argsort(-x, kind="stable")
            probs = np.exp(x[order] - x.max())
            probs /= probs.sum()
            before = np.cumsum(probs) - probs
            num_kept = max(1, int((before < top_p).sum()))
            x = np.where(x >= x[order[num_kept - 1]], x, -np.inf)
        if min_p > 0.0:
            probs = np.exp(x - x.max())
            x = np.where(probs >= min_p, x, -np.inf)
        rows.append(x - (x.max() + np.log(np.exp(x - x.max()).sum())))
    return np.array(rows).reshape(np.shape(logits))


def assert_same_logprobs(got: mx.array, want: np.ndarray) -> None:
    got = np.array(got)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_allclose(got[np.isfinite(got)], want[np.isfinite(want)], atol=2e-5)


def test_process_logits_temperature_is_scaled_log_softmax():
    """Without filters the result is log_softmax(logits / T), in float32, for any input dtype."""
    logits = np.random.default_rng(0).normal(size=(3, 40)) * 3
    for t in (0.3, 1.0, 1.7):
        got = process_logits(mx.array(logits, dtype=mx.float16), SamplerSettings(temperature=t))
        want = np_process(np.array(mx.array(logits, dtype=mx.float16).astype(mx.float32)), t)
        assert_same_logprobs(got, want)


def test_process_logits_greedy_is_one_hot_at_argmax():
    """Greedy settings give log 0 at the argmax and -inf elsewhere, whatever the filters."""
    logits = mx.array([[0.1, 2.0, -1.0, 1.9], [5.0, 0.0, 0.0, 0.0]])
    got = np.array(process_logits(logits, SamplerSettings(temperature=0.0, top_k=2, top_p=0.5)))
    want = np.array([[NEG_INF, 0.0, NEG_INF, NEG_INF], [0.0, NEG_INF, NEG_INF, NEG_INF]])
    np.testing.assert_array_equal(got, want)
    assert SamplerSettings(temperature=1e-6).greedy and not SamplerSettings(temperature=0.1).greedy


def test_process_logits_top_k_keeps_k_largest():
    """top-k keeps exactly the k largest distinct logits and renormalises them."""
    logits = np.random.default_rng(1).permutation(np.arange(20.0)) / 4
    got = np.array(process_logits(mx.array(logits), SamplerSettings(temperature=1.0, top_k=5)))
    assert set(np.flatnonzero(np.isfinite(got))) == set(np.argsort(-logits)[:5])
    assert_same_logprobs(mx.array(got), np_process(logits, 1.0, top_k=5))
    assert np.exp(got).sum() == pytest.approx(1.0, abs=1e-6)


def test_process_logits_top_p_keeps_the_boundary_token():
    """top-p keeps the smallest prefix reaching mass top_p, including the crossing token."""
    probs = np.array([0.05, 0.5, 0.15, 0.3])  # sorted: 0.5, 0.3, 0.15, 0.05
    logits = mx.array(np.log(probs))
    cases = {0.4: {1}, 0.75: {1, 3}, 0.85: {1, 3, 2}, 0.99: {0, 1, 2, 3}, 0.0: {1}}
    for top_p, kept in cases.items():
        got = np.array(process_logits(logits, SamplerSettings(temperature=1.0, top_p=top_p)))
        assert set(np.flatnonzero(np.isfinite(got))) == kept, top_p
        kept_probs = probs[sorted(kept)] / probs[sorted(kept)].sum()
        np.testing.assert_allclose(np.exp(got[sorted(kept)]), kept_probs, rtol=1e-5)


def test_process_logits_min_p_drops_tokens_below_fraction_of_max():
    """min-p drops exactly the tokens with prob < min_p * max prob."""
    probs = np.array([0.4, 0.1, 0.3, 0.2])
    logits = mx.array(np.log(probs))
    for min_p, kept in {0.3: {0, 2, 3}, 0.6: {0, 2}, 0.9: {0}}.items():
        got = np.array(process_logits(logits, SamplerSettings(temperature=1.0, min_p=min_p)))
        assert set(np.flatnonzero(np.isfinite(got))) == kept, min_p


def test_process_logits_combination_matches_numpy_reference():
    """temperature -> top-k -> top-p -> min-p on a batch matches the numpy reference row by row."""
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(4, 300)) * 2.5
    for s in [SamplerSettings(0.8, top_k=40, top_p=0.9, min_p=0.02),
              SamplerSettings(1.3, top_k=0, top_p=0.7, min_p=0.0),
              SamplerSettings(0.5, top_k=7, top_p=1.0, min_p=0.1),
              SamplerSettings(1.0, top_k=300, top_p=0.95, min_p=0.0)]:
        got = process_logits(mx.array(logits), s)
        want = np_process(logits, s.temperature, s.top_k, s.top_p, s.min_p)
        assert_same_logprobs(got, want)
        single = process_logits(mx.array(logits[2]), s)  # rows are processed independently
        np.testing.assert_array_equal(np.array(single), np.array(got)[2])


@pytest.mark.parametrize("num_candidates", [1024, 4])
def test_process_logits_top_p_partial_and_full_sort_agree(monkeypatch, num_candidates):
    """top-p matches the reference whether the nucleus fits the partial-sort candidates or not."""
    monkeypatch.setattr(sampling, "_TOP_P_CANDIDATES", num_candidates)
    rng = np.random.default_rng(3)
    vocab = 3000 if num_candidates == 1024 else 50
    for scale in (0.3, 2.0, 6.0):  # from ~70% of the vocab in the nucleus down to 1-3 tokens
        logits = rng.normal(size=(2, vocab)) * scale
        for s in (SamplerSettings(1.0, top_p=0.8), SamplerSettings(0.9, top_p=0.8, top_k=30)):
            want = np_process(logits, s.temperature, s.top_k, s.top_p)
            assert_same_logprobs(process_logits(mx.array(logits), s), want)


def test_sampler_settings_rejects_out_of_range_values():
    """SamplerSettings validates its fields."""
    for bad in [dict(temperature=-1.0), dict(top_p=1.5), dict(top_k=-1), dict(min_p=2.0)]:
        with pytest.raises(ValueError):
            SamplerSettings(**bad)


# ---------------------------------------------------------------------------------------------
# 2. Crafted +-100 logits


def spiky(ids: list[int], vocab: int = 8) -> mx.array:
    """Logits [len(ids), vocab]: +100 at ids[k] in row k, -100 elsewhere."""
    logits = np.full((len(ids), vocab), -100.0, dtype=np.float32)
    logits[np.arange(len(ids)), ids] = 100.0
    return mx.array(logits)


def test_greedy_accept_crafted_cases():
    """Greedy: perfect match -> bonus, early mismatch -> correction, empty draft -> row 0."""
    target = spiky([3, 1, 4, 5])
    assert greedy_accept([3, 1, 4], target) == (3, 5)
    assert greedy_accept([3, 2, 4], target) == (1, 1)
    assert greedy_accept([0, 1, 4], target) == (0, 3)
    assert greedy_accept([], spiky([6])) == (0, 6)
    assert greedy_accept([3, 1], spiky([3, 1, 7])) == (2, 7)  # bonus is the last row's argmax


def test_rejection_accept_crafted_cases():
    """+-100 logits make the rejection rule deterministic: match, mismatch, empty, bonus value."""
    t1 = SamplerSettings(temperature=1.0)
    logp = process_logits(spiky([3, 1, 4, 5]), t1)  # [4, 8]

    def accept(draft, target_logprobs, key):
        # The drafter is as sure of its tokens as the target is of its own.
        return rejection_accept(draft, process_logits(spiky(draft), t1), target_logprobs, key)

    for i in range(10):
        key = mix_key(7, i)
        assert accept([3, 1, 4], logp, key) == (3, 5)  # perfect match -> bonus
        assert accept([3, 2, 4], logp, key) == (1, 1)  # early mismatch -> recovered
        assert accept([0, 1], logp, key) == (0, 3)
        assert rejection_accept([], None, process_logits(spiky([6]), t1), key) == (0, 6)
        assert accept([3, 1], process_logits(spiky([3, 1, 2]), t1), key) == (2, 2)  # bonus value


def test_rejection_accept_with_one_hot_distributions_is_greedy_accept():
    """Greedy (one-hot) p and q reduce the rejection rule to greedy verification."""
    rng = np.random.default_rng(4)
    greedy = SamplerSettings(temperature=0.0)
    for i in range(30):
        target_logits = mx.array(rng.normal(size=(4, 9)))
        target_ids = np.array(mx.argmax(target_logits, axis=-1)).tolist()
        draft = [t if rng.random() < 0.7 else (t + 1) % 9 for t in target_ids[:3]]
        logq = process_logits(spiky(draft, 9), greedy)
        got = rejection_accept(draft, logq, process_logits(target_logits, greedy), mix_key(4, i))
        assert got == greedy_accept(draft, target_logits)


def test_rejection_accept_is_reproducible_per_key():
    """The same key gives the same round; different keys give different rounds."""
    rng = np.random.default_rng(5)
    logp = logs(np.stack([dirichlet(10, rng) for _ in range(4)]))
    logq = logs(np.stack([dirichlet(10, rng) for _ in range(3)]))
    draft = [1, 2, 3]
    first = [rejection_accept(draft, logq, logp, mix_key(11, i)) for i in range(40)]
    again = [rejection_accept(draft, logq, logp, mix_key(11, i)) for i in range(40)]
    assert first == again
    assert len(set(first)) > 3


# ---------------------------------------------------------------------------------------------
# 3. Analytic single step


def exact_output_probs(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """P(out = y) of one step of the rule, using the module's residual_probs."""
    p64, q64 = p.astype(np.float64), q.astype(np.float64)
    accept = np.where(q64 > 0, np.minimum(1.0, p64 / np.where(q64 > 0, q64, 1.0)), 0.0)
    residual = np.array(sampling.residual_probs(mx.array(p), mx.array(q)), dtype=np.float64)
    return q64 * accept + (q64 * (1.0 - accept)).sum() * residual


def analytic_cases() -> list[tuple[np.ndarray, np.ndarray]]:
    """Hand-picked and random (p, q) pairs, float32, V = 5..10."""
    rng = np.random.default_rng(6)

    def f(*v: float) -> np.ndarray:
        return np.array(v, dtype=np.float32)

    p5 = f(0.1, 0.2, 0.3, 0.25, 0.15)
    cases = [
        (p5, p5.copy()),  # p == q
        (f(0.5, 0.5, 0, 0, 0, 0), f(0, 0, 0.2, 0.3, 0.1, 0.4)),  # disjoint supports
        (p5, f(0, 0, 1, 0, 0)),  # one-hot q
        (f(0.2, 0.2, 0.2, 0.2, 0.1, 0.1), f(0.5, 0, 0.25, 0, 0.25, 0)),  # q = 0 where p > 0
        (f(0.6, 0, 0.4, 0, 0, 0, 0), dirichlet(7, rng)),  # p = 0 where q > 0
    ]
    for vocab in range(5, 11):
        cases.append((dirichlet(vocab, rng), dirichlet(vocab, rng, alpha=0.3)))
    return cases


@pytest.mark.parametrize("p, q", analytic_cases())
def test_one_step_rule_is_exactly_lossless(p, q):
    """Exact P(out = y) of one accept-or-residual step equals p(y) to 1e-6 (float32 inputs)."""
    np.testing.assert_allclose(exact_output_probs(p, q), p, rtol=0, atol=1e-6)


def test_residual_probs_properties():
    """Residual is norm(max(0, p - q)), row-wise, and falls back to p when p == q."""
    p = mx.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
    q = mx.array([[0.2, 0.6, 0.2], [0.2, 0.3, 0.5]])
    r = np.array(residual_probs(p, q))
    np.testing.assert_allclose(r[0], [1.0, 0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(r[1], [0.2, 0.3, 0.5], atol=1e-6)  # fallback to p
    np.testing.assert_allclose(np.array(residual_probs(p[0], q[0])), r[0], atol=1e-7)


# ---------------------------------------------------------------------------------------------
# 4. Monte-Carlo single step

# A pair with large TV and a residual far from p, so the controls have power.
P_STEP = np.array([0.30, 0.02, 0.20, 0.05, 0.15, 0.08, 0.12, 0.08], dtype=np.float32)
Q_STEP = np.array([0.05, 0.25, 0.10, 0.20, 0.15, 0.00, 0.15, 0.10], dtype=np.float32)


def vectorised_step(p: np.ndarray, q: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Test-local batch version of one accept step, built on sampling.residual_probs."""
    rng = np.random.default_rng(seed)
    x = draw(q, n, rng)
    accepted = rng.random(n) * q[x] < p[x]
    residual = np.array(sampling.residual_probs(mx.array(p), mx.array(q)))
    return np.where(accepted, x, draw(residual, n, rng))


def real_step(p: np.ndarray, q: np.ndarray, n: int, seed: int) -> np.ndarray:
    """n single-draft rounds through the real rejection_accept; returns the emitted first token."""
    logp, logq = logs(np.stack([p, p])), logs(q[None])
    drafts = draw(q, n, np.random.default_rng(seed)).tolist()
    out = []
    for i, x in enumerate(drafts):
        num_accepted, token = rejection_accept([x], logq, logp, mix_key(seed, i))
        out.append(x if num_accepted else token)
    return np.array(out)


def test_one_step_monte_carlo_vectorised_matches_p():
    """200k vectorised accept-or-residual draws fit p (chi-square and TV), for several pairs."""
    rng = np.random.default_rng(8)
    pairs = [(P_STEP, Q_STEP), (P_STEP, P_STEP)]
    pairs += [(dirichlet(10, rng), dirichlet(10, rng, 0.3)) for _ in range(3)]
    for i, (p, q) in enumerate(pairs):
        assert_fits(vectorised_step(p, q, 200_000, seed=i), p)


def test_one_step_monte_carlo_real_rejection_accept_matches_p():
    """20k single-draft rounds of the real rejection_accept emit a first token ~ p."""
    assert_fits(real_step(P_STEP, Q_STEP, 20_000, seed=9), P_STEP)


# ---------------------------------------------------------------------------------------------
# 5. Block level (l = 3, V = 6; p and q rows independent of the prefix)

P_BLOCK = np.array([
    [0.30, 0.25, 0.20, 0.10, 0.10, 0.05],
    [0.05, 0.10, 0.15, 0.20, 0.25, 0.25],
    [0.40, 0.05, 0.05, 0.20, 0.20, 0.10],
    [0.02, 0.03, 0.05, 0.10, 0.30, 0.50],  # bonus row: far from q_2 and from accepted x_2
], dtype=np.float32)
Q_BLOCK = np.array([
    [0.20, 0.30, 0.10, 0.20, 0.05, 0.15],
    [0.10, 0.05, 0.25, 0.20, 0.20, 0.20],
    [0.30, 0.15, 0.10, 0.15, 0.25, 0.05],
], dtype=np.float32)
N_BLOCK = 20_000


def run_blocks(n: int, seed: int) -> list[tuple[list[int], int, int]]:
    """n rounds with three drafts x_k ~ q_k; returns (drafts, num_accepted, next_token) each."""
    rng = np.random.default_rng(seed)
    drafts = np.stack([draw(q, n, rng) for q in Q_BLOCK], axis=1).tolist()  # [n, 3]
    logp, logq = logs(P_BLOCK), logs(Q_BLOCK)
    return [(d, *rejection_accept(d, logq, logp, mix_key(seed, i))) for i, d in enumerate(drafts)]


def emitted_at(rounds, position: int) -> list[int]:
    """Token emitted at `position` in the rounds that reached it (n >= position)."""
    return [(d[position] if n > position else y) for d, n, y in rounds if n >= position]


def bonus_tokens(rounds) -> list[int]:
    return [y for d, n, y in rounds if n == len(d)]


@pytest.fixture(scope="module")
def block_rounds():
    return run_blocks(N_BLOCK, seed=10)


def test_block_each_emitted_position_matches_target_row(block_rounds):
    """In a 3-draft round the token at position k (when reached) ~ p_k, and the bonus ~ p_3."""
    for position in range(3):
        assert_fits(emitted_at(block_rounds, position), P_BLOCK[position])
    bonus = bonus_tokens(block_rounds)
    assert len(bonus) > 5_000
    assert_fits(bonus, P_BLOCK[3])


def test_block_second_token_is_independent_of_accepted_first(block_rounds):
    """Given x_0 accepted, the pair (x_0, token 1) ~ norm(min(p_0, q_0)) x p_1 jointly."""
    accepted_first = np.minimum(P_BLOCK[0], Q_BLOCK[0])
    joint = np.outer(accepted_first / accepted_first.sum(), P_BLOCK[1]).ravel()  # [36]
    pairs = [d[0] * 6 + (d[1] if n > 1 else y) for d, n, y in block_rounds if n >= 1]
    assert_fits(pairs, joint)


def test_block_acceptance_rates_are_one_minus_tv(block_rounds):
    """P(accept x_k | reached k) = sum min(p_k, q_k) within 5 binomial standard errors."""
    nums = np.array([n for _, n, _ in block_rounds])
    for k in range(3):
        reached = (nums >= k).sum()
        rate = (nums > k).sum() / reached
        alpha = np.minimum(P_BLOCK[k], Q_BLOCK[k]).sum()
        assert abs(rate - alpha) < 5 * math.sqrt(alpha * (1 - alpha) / reached)


# ---------------------------------------------------------------------------------------------
# 6. Negative controls: the same checks must fail


def residual_from_p(p, q):
    return p


def bonus_resampled_from_q(draft_ids, draft_logprobs, target_logprobs, key):
    return sampling.categorical_token(draft_logprobs[len(draft_ids) - 1], key).item()


def bonus_repeats_last_draft(draft_ids, draft_logprobs, target_logprobs, key):
    return draft_ids[-1]


def test_control_residual_from_p_fails_the_same_checks(monkeypatch):
    """Resampling from p instead of max(0, p - q) is caught analytically and by both MC tests."""
    monkeypatch.setattr(sampling, "residual_probs", residual_from_p)
    assert np.abs(exact_output_probs(P_STEP, Q_STEP) - P_STEP).max() > 1e-2
    assert_detected(vectorised_step(P_STEP, Q_STEP, 200_000, seed=0), P_STEP)
    assert_detected(real_step(P_STEP, Q_STEP, 20_000, seed=9), P_STEP)


@pytest.mark.parametrize("broken_bonus", [bonus_resampled_from_q, bonus_repeats_last_draft])
def test_control_missing_bonus_fails_the_same_checks(monkeypatch, broken_bonus):
    """Replacing the bonus draw from p_l (resample q, or repeat a draft) fails the bonus check."""
    monkeypatch.setattr(sampling, "_bonus", broken_bonus)
    rounds = run_blocks(N_BLOCK, seed=10)
    assert_fits(emitted_at(rounds, 0), P_BLOCK[0])  # the first token is unaffected...
    assert_detected(bonus_tokens(rounds), P_BLOCK[3])  # ...but the bonus is wrong


# ---------------------------------------------------------------------------------------------
# 7. mix_key


def test_mix_key_is_deterministic_and_counter_sensitive():
    """Same (seed, counters) -> same key; any change of seed, counter or order -> another key."""
    key = np.array(mix_key(1, 2, 3))
    assert key.dtype == np.uint32 and key.shape == (2,)
    np.testing.assert_array_equal(key, np.array(mix_key(1, 2, 3)))
    others = [mix_key(0, 2, 3), mix_key(1, 3, 3), mix_key(1, 3, 2), mix_key(1, 2),
              mix_key(1, 2, 3, 0)]
    keys = {tuple(np.array(k).tolist()) for k in others} | {tuple(key.tolist())}
    assert len(keys) == len(others) + 1
    mix_key(-1, 2**70)  # out-of-range ints are reduced mod 2^64, not rejected


def test_mix_key_streams_look_independent():
    """First uniforms from keys with consecutive counters are ~U(0,1) and uncorrelated."""
    u = np.array([mx.random.uniform(key=mix_key(123, i)).item() for i in range(4000)])
    assert_fits(np.minimum((u * 20).astype(int), 19), np.full(20, 0.05))
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.07
    v = np.array([mx.random.uniform(key=mix_key(124, i)).item() for i in range(4000)])
    assert abs(np.corrcoef(u, v)[0, 1]) < 0.07  # neighbouring seeds too


def test_sampling_never_touches_global_random_state():
    """mix_key and all samplers leave the global MLX PRNG exactly where it was."""
    mx.random.seed(2024)
    expected = mx.random.uniform(shape=(4,))
    mx.random.seed(2024)
    logp = logs(np.stack([P_BLOCK[0], P_BLOCK[1]]))
    rejection_accept([0], logs(Q_BLOCK[:1]), logp, mix_key(1, 2))
    sample_draft(mx.array(np.log(P_BLOCK[0])), SamplerSettings(1.0), mix_key(3))
    seed_stable_accept([0], logp, seed=5, first_position=9)
    got = mx.random.uniform(shape=(4,))
    np.testing.assert_array_equal(np.array(got), np.array(expected))


# ---------------------------------------------------------------------------------------------
# Draft sampling


def test_sample_draft_returns_its_distribution_and_samples_from_it():
    """sample_draft's logq equals process_logits and its tokens ~ exp(logq); greedy -> argmax."""
    logits = mx.array(np.random.default_rng(12).normal(size=12) * 2)
    s = SamplerSettings(temperature=0.8, top_k=8, top_p=0.95)
    token, logq = sample_draft(logits, s, mix_key(0))
    np.testing.assert_array_equal(np.array(logq), np.array(process_logits(logits, s)))
    tokens = [sample_draft(logits, s, mix_key(12, i))[0] for i in range(10_000)]
    assert_fits(tokens, np.exp(np.array(logq, dtype=np.float64)))
    greedy_token = int(mx.argmax(logits).item())
    assert sample_draft(logits, SamplerSettings(), mix_key(0)) == (greedy_token, None)


# ---------------------------------------------------------------------------------------------
# 8. Seed-stable sampling


def seed_stable_decode(table: mx.array, seed: int, rng: np.random.Generator, propose):
    """Speculative seed-stable decoding over fixed per-position rows [P, V], random l = 0..4.

    `propose(position, target_ids)` returns the drafts for the next len(target_ids) positions
    (it may peek at the right answers to build perfect or wrong drafts). Returns (speculative
    tokens, plain seed-stable tokens, fraction of drafts accepted).
    """
    num_positions = table.shape[0]
    baseline = [seed_stable_token(table[i], seed, i).item() for i in range(num_positions)]
    out: list[int] = []
    num_accepted = num_drafted = 0
    while len(out) < num_positions:
        pos = len(out)
        rows = table[pos : pos + int(rng.integers(0, 5)) + 1]  # [l+1, V], clipped at the end
        draft = propose(pos, baseline[pos : pos + rows.shape[0] - 1])
        n, token = seed_stable_accept(draft, rows, seed, pos)
        out += draft[:n] + [token]
        num_accepted, num_drafted = num_accepted + n, num_drafted + len(draft)
    return out[:num_positions], baseline, num_accepted / max(num_drafted, 1)


SEED_STABLE_SETTINGS = SamplerSettings(temperature=0.9, top_k=9)


def make_proposer(mode: str, draft_logits: mx.array, seed: int, rng: np.random.Generator):
    """Drafts that are perfect, all wrong, random, mostly right, or Gumbel-coupled to the target."""
    vocab = draft_logits.shape[-1]
    if mode == "perfect":
        return lambda pos, ids: list(ids)
    if mode == "wrong":
        return lambda pos, ids: [(t + 1) % vocab for t in ids]
    if mode == "random":
        return lambda pos, ids: rng.integers(0, vocab, len(ids)).tolist()
    if mode == "mixed":
        return lambda pos, ids: [t if rng.random() < 0.6 else int(rng.integers(0, vocab))
                                 for t in ids]
    return lambda pos, ids: [  # "coupled": a real drafter with q close to p
        seed_stable_draft(draft_logits[pos + j], SEED_STABLE_SETTINGS, seed, pos + j)
        for j in range(len(ids))
    ]


@pytest.mark.parametrize("mode", ["perfect", "wrong", "random", "mixed", "coupled"])
def test_seed_stable_accept_emits_baseline_tokens_for_any_draft(mode):
    """Speculative seed-stable decoding emits the plain seed-stable tokens, position by position."""
    rng = np.random.default_rng(13)
    target_logits = rng.normal(size=(40, 12)) * 1.5
    draft_logits = mx.array(target_logits + rng.normal(size=(40, 12)) * 0.2)  # q close to p
    table = process_logits(mx.array(target_logits), SEED_STABLE_SETTINGS)  # [40, 12]
    for seed in (0, 1, 2**40 + 7):
        propose = make_proposer(mode, draft_logits, seed, rng)
        out, baseline, accept_rate = seed_stable_decode(table, seed, rng, propose)
        assert out == baseline
        if mode == "coupled":  # shared noise makes drafts from q ~ p match most of the time
            assert accept_rate > 0.7


def test_seed_stable_accept_perfect_and_wrong_drafts():
    """A perfect draft is fully accepted with the bonus; a wrong first draft accepts nothing."""
    table = logs(np.stack([dirichlet(9, np.random.default_rng(i)) for i in range(4)]))
    target = [seed_stable_token(table[k], 3, 20 + k).item() for k in range(4)]
    assert seed_stable_accept(target[:3], table, 3, 20) == (3, target[3])
    assert seed_stable_accept([(target[0] + 1) % 9] + target[1:3], table, 3, 20) == (0, target[0])


def test_seed_stable_sample_over_seeds_matches_p():
    """Across seeds, seed_stable_sample at a fixed position is an exact draw from p."""
    p = P_STEP
    tokens = [seed_stable_token(logs(p), seed, 17).item() for seed in range(20_000)]
    assert_fits(tokens, p)


def test_seed_stable_draft_is_coupled_and_samples_q():
    """seed_stable_draft equals the target token when q == p, and is itself ~ q over seeds."""
    logits = mx.array(np.random.default_rng(14).normal(size=10) * 1.5)
    s = SamplerSettings(temperature=1.1, top_p=0.97)
    logp = process_logits(logits, s)
    drafts = [seed_stable_draft(logits, s, seed, 5) for seed in range(8_000)]
    assert drafts == [seed_stable_token(logp, seed, 5).item() for seed in range(8_000)]
    assert_fits(drafts, np.exp(np.array(logp, dtype=np.float64)))
    assert seed_stable_draft(logits, SamplerSettings(), 0, 5) == int(mx.argmax(logits).item())
