"""Draft-length schedulers: fixed caps, threshold, the R = 1 Algorithm 1 and the cost-curve cache."""

import json

import pytest

from engine import costs
from engine.backend import thread_choices
from engine.scheduler import PRIOR_ROUNDS, PROBE_EVERY, AutoScheduler, CostCurve, Scheduler, ThresholdScheduler, expected_tokens
from tests.engine import tiny

# Verify cost grows with width like BLIS on this CPU: 1, 1.5, 1.7, 1.9, 2.1 x one decode step.
CURVE = CostCurve(verify_s=[1.0, 1.5, 1.7, 1.9, 2.1], draft_fixed_s=0.1, draft_per_token_s=0.02)


def admitted(s, confidences, limit=10):
    s.begin_round(limit)
    n = 0
    for k, c in enumerate(confidences, start=1):
        if not s.admit(k, c):
            break
        n = k
    return n


def test_fixed_cap_and_round_limit():
    """A fixed cap admits exactly min(cap, limit) drafts, whatever the confidences say."""
    assert admitted(Scheduler(3), [0.0] * 5) == 3
    assert admitted(Scheduler(3), [1.0] * 5, limit=2) == 2


def test_threshold_on_prefix_survival():
    """ThresholdScheduler stops at the first k whose product of confidences falls below theta."""
    assert admitted(ThresholdScheduler(6, 0.5), [0.9, 0.9, 0.9, 0.9, 0.9, 0.9]) == 6  # 0.9^6 = 0.53
    assert admitted(ThresholdScheduler(6, 0.7), [0.9, 0.9, 0.9, 0.9]) == 3  # 0.729, then 0.656 < 0.7
    assert admitted(ThresholdScheduler(6, 0.7), [0.5, 1.0]) == 0


def test_auto_with_confidence_is_algorithm1_with_early_stop():
    """Auto admits while (1 + sum a_j) / T(l) improves and stops at the first non-improvement."""
    conf = [0.95, 0.9, 0.2, 0.99]
    n = admitted(AutoScheduler(4, CURVE, use_confidence=True), conf)
    rates, survival, expected = [1 / CURVE.round_time(0)], 1.0, 1.0
    for k, c in enumerate(conf, start=1):
        survival *= c
        expected += survival
        rates.append(expected / CURVE.round_time(k))
    first_drop = next(k for k in range(1, 5) if rates[k] <= max(rates[:k]))
    assert n == first_drop - 1 == 2
    # even though a later position would look good again, the early stop never reaches it
    assert admitted(AutoScheduler(4, CURVE, use_confidence=True), [0.95, 0.9, 0.2, 1.0]) == 2


def test_auto_without_confidence_uses_estimates_fixed_per_round():
    """Without a confidence head the cap comes from running acceptance estimates, not the drafts."""
    s = AutoScheduler(4, CURVE, use_confidence=False, prior=0.9)
    high = admitted(s, [None] * 4)
    for _ in range(200):
        s.observe(num_verified=4, num_accepted=0)
    low = admitted(s, [None] * 4)
    assert high >= 2 and low == 0
    assert CURVE.best_cap([0.99] * 4, 4)[0] == 4 and CURVE.best_cap([0.1] * 4, 4)[0] == 0


@pytest.mark.parametrize("make", [lambda: Scheduler(4), lambda: ThresholdScheduler(4, 0.4),
                                  lambda: AutoScheduler(4, CURVE, use_confidence=True)])
def test_non_anticipating(make):
    """admit(k) is decided from c_1..c_k only: the draft sampled at k cannot change it."""
    import random

    rng = random.Random(0)
    for _ in range(200):
        conf = [rng.random() for _ in range(4)]
        s1, s2 = make(), make()
        s1.begin_round(4)
        s2.begin_round(4)
        for k in range(1, 5):
            assert s1.admit(k, conf[k - 1]) == s2.admit(k, conf[k - 1])


def test_cost_curve_measured_once_and_cached(tmp_path, monkeypatch):
    """The round-cost curve is measured on first use and read back from the cache afterwards."""
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path))
    target, drafter = tiny.tiny_target(), tiny.dspark_drafter()
    curve = costs.load_or_measure(target, drafter, "tiny-model", "tiny-drafter", 4)
    assert len(curve.verify_s) == 5 and all(t > 0 for t in curve.verify_s)
    files = list((tmp_path / "costs").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["meta"]["model"] == "tiny-model"
    assert curve.decode_threads in ([None] if not thread_choices() else thread_choices())
    assert curve.plain_step_s > 0 and curve.round_time(0) == curve.plain_step_s
    monkeypatch.setattr(costs, "measure_curve", lambda *a: pytest.fail("measured again"))
    cached = costs.load_or_measure(target, drafter, "tiny-model", "tiny-drafter", 4)
    assert cached.verify_s == curve.verify_s and cached.decode_threads == curve.decode_threads


def test_cost_curve_key_is_the_shapes_not_the_path_or_weights():
    """Two drafters of one shape share a cached curve wherever they were loaded from; another shape does not."""
    target = tiny.tiny_target()
    one, two = tiny.dspark_drafter(seed=3), tiny.dspark_drafter(seed=9)
    assert costs.curve_key(target, one, 4) == costs.curve_key(target, two, 4)
    assert costs.curve_key(target, one, 4) != costs.curve_key(target, tiny.dflash_drafter(target), 4)
    assert costs.curve_key(target, one, 4) != costs.curve_key(target, one, 3)
    assert costs.curve_key(target, one, 4) != costs.curve_key(target, None, 4)


def test_decode_threads_choice_prefers_loaded_count_on_a_tie(monkeypatch):
    """The other thread count replaces the loaded one only when its round proxy is clearly faster."""
    target, drafter = tiny.tiny_target(), tiny.dspark_drafter()
    monkeypatch.setattr(costs, "thread_choices", lambda: [1, 2])
    monkeypatch.setattr(costs.BLAS, "threads", 2)
    for times, want in (([1.0, 1.0], 2), ([0.99, 1.0], 2), ([0.9, 1.0], 1), ([1.2, 1.0], 2)):
        monkeypatch.setattr(costs, "_round_robin_best", lambda timed, sizes, repeats, t=times: list(t))
        assert costs.choose_decode_threads(target, drafter, 4) == want, times
    monkeypatch.setattr(costs, "thread_choices", lambda: [])
    assert costs.choose_decode_threads(target, drafter, 4) is None


def test_old_cached_curve_without_threads_loads(tmp_path, monkeypatch):
    """A curve cached before the thread choice existed still loads, decoding at the loaded count."""
    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path))
    target, drafter = tiny.tiny_target(), tiny.dspark_drafter()
    costs.load_or_measure(target, drafter, "tiny-model", "tiny-drafter", 4)
    path = next((tmp_path / "costs").glob("*.json"))
    raw = json.loads(path.read_text())
    raw.pop("decode_threads")
    path.write_text(json.dumps(raw))
    assert costs.load_or_measure(target, drafter, "tiny-model", "tiny-drafter", 4).decode_threads is None


def test_performance_model_formula():
    """Predicted speedup = (1 + sum of prefix survivals) / (T(l) / T(0)); the ceiling assumes every draft kept."""
    assert expected_tokens([0.5, 0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([0.9], 3) == pytest.approx(1.9)  # positions without a rate count as rejected
    assert CURVE.relative_round_time(0) == 1.0
    assert CURVE.relative_round_time(2) == pytest.approx((1.7 + 0.1 + 0.04) / 1.0)
    assert CURVE.predicted_speedup([0.8, 0.5], 2) == pytest.approx((1 + 0.8 + 0.4) / 1.84)
    assert CURVE.ceiling(4) == pytest.approx(5 / (2.1 + 0.1 + 0.08))
    # best_cap maximises exactly the predicted speedup
    acc = [0.9, 0.8, 0.3, 0.9]
    best = max(range(5), key=lambda k: CURVE.predicted_speedup(acc, k))
    assert CURVE.best_cap(acc, 4)[0] == best


def test_estimates_leave_a_poor_prior_within_a_few_rounds():
    """The first outcomes weigh as a running mean with the prior as PRIOR_ROUNDS pseudo-rounds, then the
    EMA takes over: a drafter that misses stops being drafted within a handful of rounds."""
    s = AutoScheduler(4, CURVE, use_confidence=False, prior=0.6)
    s.observe(num_verified=1, num_accepted=0)
    assert s.acceptance[0] == pytest.approx(0.6 * PRIOR_ROUNDS / (PRIOR_ROUNDS + 1))
    assert s.acceptance[1] == 0.6  # not verified: unchanged
    for _ in range(5):
        s.observe(num_verified=1, num_accepted=0)
    assert s.acceptance[0] == pytest.approx(0.6 * PRIOR_ROUNDS / (PRIOR_ROUNDS + 6))
    assert not s.wants_draft()
    for _ in range(100):
        s.observe(num_verified=1, num_accepted=1)
    before = s.acceptance[0]
    s.observe(num_verified=1, num_accepted=0)  # long past the prior: the EMA weight
    assert s.acceptance[0] == pytest.approx(before * 0.95)


def test_plain_step_time_is_the_models_decode_step():
    """With a measured (pipelined) plain step, T(0) is that step: every relative time and speedup uses it."""
    curve = CostCurve(verify_s=[1.0, 1.5, 1.7], draft_fixed_s=0.1, draft_per_token_s=0.02, plain_step_s=0.8)
    assert curve.round_time(0) == 0.8 and curve.round_time(1) == pytest.approx(1.5 + 0.12)
    assert curve.relative_round_time(1) == pytest.approx(1.62 / 0.8)
    assert curve.predicted_speedup([0.9], 1) == pytest.approx(1.9 / (1.62 / 0.8))


def test_flat_verify_curve_is_relative_and_labelled():
    """The assumed bandwidth-bound curve keeps the measured draft cost relative to one decode step."""
    flat = costs.flat_verify_curve(CURVE, row_growth=0.05)
    assert flat.verify_s == pytest.approx([1.0, 1.05, 1.1, 1.15, 1.2]) and flat.meta["predicted"]
    assert flat.draft_fixed_s == pytest.approx(0.1) and flat.predicted_speedup([1.0] * 4, 4) > CURVE.predicted_speedup([1.0] * 4, 4)


def test_fresh_curve_remeasures_and_recaches(tmp_path, monkeypatch):
    """with_fresh_curve measures again even when a curve is cached, caches it, and resets auto's cap."""
    from engine.api import EngineInfo, SpecConfig
    from engine.runtime import Runtime, initial_auto_cap, with_fresh_curve

    monkeypatch.setenv("DSPARK_CACHE", str(tmp_path))
    target, drafter = tiny.tiny_target(), tiny.dspark_drafter()
    stale = costs.load_or_measure(target, drafter, "tiny-model", "tiny-drafter", 4)
    info = EngineInfo(model_id="t", model_path="tiny-model", mode="dspark", drafter="tiny-drafter", cap=1,
                      context_length=64, sampler="rejection")
    runtime = Runtime(target, drafter, None, info, frozenset(), SpecConfig(), stale)
    fresh = CostCurve(verify_s=[1.0, 1.01, 1.02, 1.03, 1.04], draft_fixed_s=0.0, draft_per_token_s=0.0)
    monkeypatch.setattr(costs, "measure_curve", lambda *a: fresh)
    out = with_fresh_curve(runtime)
    assert out.curve.verify_s == fresh.verify_s and out.info.cap == initial_auto_cap(fresh, 4) == 4
    assert costs.load_or_measure(target, drafter, "tiny-model", "tiny-drafter", 4).verify_s == fresh.verify_s
    assert runtime.curve is stale  # the original runtime is left as it was


@pytest.mark.parametrize("use_confidence", [False, True])
def test_auto_skips_rounds_that_cannot_pay_and_probes_with_one_draft(use_confidence):
    """Low estimates: no drafter pass except a probe every PROBE_EVERY rounds, which verifies one
    draft whatever the confidence; estimates that recover bring the drafter back every round."""
    s = AutoScheduler(4, CURVE, use_confidence=use_confidence, prior=0.9)
    assert s.wants_draft()
    for _ in range(200):
        s.observe(num_verified=4, num_accepted=0)
    decisions = [s.wants_draft() for _ in range(2 * PROBE_EVERY)]
    assert decisions.count(True) == 2 and decisions[PROBE_EVERY - 1] and decisions[-1]
    assert admitted(s, [0.01] * 4 if use_confidence else [None] * 4) == 1  # the probe's one draft
    for _ in range(200):
        s.observe(num_verified=4, num_accepted=4)
    assert all(s.wants_draft() for _ in range(PROBE_EVERY))
