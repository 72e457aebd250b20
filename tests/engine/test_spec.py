"""Speculative rounds: tie-aware greedy equivalence, invariants, index conventions, stopping."""

import mlx.core as mx
import pytest

from engine.api import SpecStats
from engine.sampling import SamplerSettings
from engine.scheduler import PROBE_EVERY, AutoScheduler, CostCurve, Scheduler, ThresholdScheduler
from engine.samplers import make_sampler
from engine.spec import DecodeOptions, SpecDecoder
from tests.engine import tiny

PROMPTS = [[1, 17, 42, 99, 5], [200, 3, 3, 3, 7, 8, 9, 10, 11, 12], [64]]
GREEDY = SamplerSettings(temperature=0.0)
TIE_EPS = 1e-4  # fp32 top1 - top2 gap below which a divergence counts as a tie (docs/method.md §7.1)


def make_decoder(target, drafter, cap, settings=GREEDY, sampler="rejection", seed=0, stop_ids=(), scheduler=None):
    """A SpecDecoder with a fixed-cap scheduler unless one is given."""
    opts = DecodeOptions(make_sampler(settings, sampler, seed), stop_ids=frozenset(stop_ids))
    stats = SpecStats(mode="baseline" if drafter is None else "dspark", cap=cap)
    dec = SpecDecoder(target, drafter, scheduler or (Scheduler(cap) if drafter is not None else None), opts, stats)
    if isinstance(drafter, tiny.OracleDrafter):
        drafter.committed = dec.committed_view()
    return dec


def run(dec, prompt, max_tokens, check=True):
    """Generate up to max_tokens; check invariants after every round."""
    out = dec.prefill(prompt)
    while len(out) < max_tokens and not dec.done:
        out += dec.step(max_tokens - len(out))
        if check:
            dec.check_invariants()
    return out


def first_divergence(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def top2_gap(target, ids):
    logits = target.model(mx.array([ids]))[0, -1]
    top = mx.sort(logits)[-2:].tolist()
    return top[1] - top[0]


@pytest.fixture(scope="module")
def target():
    return tiny.tiny_target(seed=0, scale=4.0)


def drafters(target):
    return {
        "dspark-random": tiny.dspark_drafter(),
        "dflash-random": tiny.dflash_drafter(target),
        "oracle": tiny.OracleDrafter(target),
        "always-wrong": tiny.OracleDrafter(target, shift=1),
    }


@pytest.mark.parametrize("cap", [1, 2, 4])
def test_greedy_equivalence_tiny(target, cap):
    """Greedy speculative ids equal plain greedy ids for every drafter and cap (ties reported)."""
    for name, drafter in drafters(target).items():
        cap_eff = min(cap, drafter.config.max_drafts)
        for prompt in PROMPTS:
            plain = run(make_decoder(target, None, None), prompt, 24)
            spec = run(make_decoder(target, drafter, cap_eff), prompt, 24)
            i = first_divergence(plain, spec)
            if i is not None:
                gap = top2_gap(target, prompt + plain[:i])
                assert gap <= TIE_EPS, f"{name} cap {cap}: diverged at {i} with top-2 gap {gap}"
            assert len(spec) == len(plain)


def test_oracle_accepts_everything_and_wrong_accepts_nothing(target):
    """Acceptance bookkeeping: the oracle's drafts all pass, the shifted oracle's never do."""
    dec = make_decoder(target, tiny.OracleDrafter(target), 4)
    run(dec, PROMPTS[0], 21)
    assert dec.stats.accepted_tokens == dec.stats.drafted_tokens > 0
    assert dec.stats.mean_accepted_length == pytest.approx(5.0)
    dec = make_decoder(target, tiny.OracleDrafter(target, shift=1), 4)
    run(dec, PROMPTS[0], 21)
    assert dec.stats.accepted_tokens == 0 and dec.stats.drafted_tokens > 0


def test_max_tokens_exact_mid_round(target):
    """max_tokens ending in the middle of a round is exact and equals the plain prefix."""
    plain = run(make_decoder(target, None, None), PROMPTS[1], 30)
    for n in (1, 2, 6, 7, 13):
        out = run(make_decoder(target, tiny.OracleDrafter(target), 4), PROMPTS[1], n)
        assert out == plain[:n]


def test_stop_token_inside_accepted_block(target):
    """A stop id inside an accepted block ends the output there, with no extra token."""
    plain = run(make_decoder(target, None, None), PROMPTS[0], 20)
    stop = plain[6]
    k = plain.index(stop)
    out = run(make_decoder(target, tiny.OracleDrafter(target), 4, stop_ids=[stop]), PROMPTS[0], 20)
    assert out == plain[: k + 1]


@pytest.mark.parametrize("layout", ["dspark", "dflash"])
def test_index_convention_and_cache_against_uncached_reference(target, layout):
    """DSpark slot j drafts p+j+1, z-lab slot i drafts p+i, and the incremental draft context cache
    equals a full uncached recompute, over rounds with mixed (forced) accept lengths."""
    drafter = tiny.dspark_drafter() if layout == "dspark" else tiny.dflash_drafter(target)
    cfg = drafter.config
    dec = make_decoder(target, drafter, cfg.max_drafts)
    seen = {}
    real_draft_hidden = drafter.draft_hidden
    drafter.draft_hidden = lambda h: (seen.__setitem__("h", h[0]), real_draft_hidden(h))[1]
    try:
        dec.prefill(PROMPTS[1])
        for forced in (0, 2, 1, 3, 0, 2):
            committed = list(dec.committed)
            p = len(committed) - 1
            drafts, _ = dec.draft(limit=cfg.max_drafts)
            # Independent reference: taps of committed[:p] from a fresh uncached target forward.
            _, taps = target.forward(mx.array([committed[:p]]), target.make_cache())
            block = mx.array([[committed[-1]] + [cfg.mask_token_id] * (cfg.block_size - 1)])
            h_ref = drafter.reference_forward(taps, block)[0]  # [B, d]
            assert mx.allclose(seen["h"], h_ref, atol=1e-4).item()
            slot = 0 if layout == "dspark" else 1  # the slot that drafts position p + 1
            logits = drafter.base_logits(h_ref[slot])
            if drafter.has_markov:
                logits = logits + drafter.markov_bias(mx.array([committed[-1]]))[0]
            assert drafts[0] == mx.argmax(logits).item()
            # Commit `forced` drafts whatever the target says: exercises every roll-back length.
            logits_v, taps_v = dec._verify(drafts)
            n = min(forced, len(drafts))
            dec._commit(drafts[:n] + [mx.argmax(logits_v[n]).item()])
            dec._roll_back(len(drafts), n, taps_v)
            dec.check_invariants()
    finally:
        del drafter.draft_hidden


def test_confidence_threshold_truncation_is_lossless_greedy(target):
    """Threshold truncation on the prefix survival changes lengths, never greedy ids."""
    plain = run(make_decoder(target, None, None), PROMPTS[0], 20)
    drafter = tiny.dspark_drafter()
    for theta in (0.0, 0.3, 0.9):
        dec = make_decoder(target, drafter, 4, scheduler=ThresholdScheduler(4, theta))
        assert run(dec, PROMPTS[0], 20) == plain


def _counting_backbone(drafter):
    calls = []
    inner = drafter.backbone

    def backbone(*args, **kwargs):
        calls.append(1)
        return inner(*args, **kwargs)

    drafter.backbone = backbone
    return calls


@pytest.mark.parametrize("use_confidence", [False, True])
def test_auto_skips_the_drafter_while_drafts_cannot_pay_and_stays_exact(target, use_confidence):
    """With drafts that never pass, `auto` soon runs plain steps (no backbone pass) and probes once in
    PROBE_EVERY rounds; the queued context keeps the cache invariants and the output is plain greedy."""
    curve = CostCurve(verify_s=[1.0, 1.5, 1.7, 1.9, 2.1], draft_fixed_s=0.2, draft_per_token_s=0.02)
    plain = run(make_decoder(target, None, None), PROMPTS[1], 60)
    wrong = tiny.dspark_drafter() if use_confidence else tiny.OracleDrafter(target, shift=1)
    calls = _counting_backbone(wrong)
    dec = make_decoder(target, wrong, 4, scheduler=AutoScheduler(4, curve, use_confidence=use_confidence))
    assert run(dec, PROMPTS[1], 60) == plain
    assert dec.stats.rounds == 59 and len(calls) < 59 // PROBE_EVERY + 12, len(calls)

    oracle = tiny.OracleDrafter(target)
    calls = _counting_backbone(oracle)
    dec = make_decoder(target, oracle, 4, scheduler=AutoScheduler(4, curve, use_confidence=False))
    assert run(dec, PROMPTS[1], 60) == plain
    assert len(calls) == dec.stats.rounds and dec.stats.accepted_tokens == dec.stats.drafted_tokens > 0


def _sync_baseline(dec, prompt, max_tokens):
    """Plain decoding without pipelining: each token is read before the next forward is built."""
    out = dec.prefill(prompt)
    while len(out) < max_tokens and not dec.done:
        out += dec._plain_step(queue_next=False)
    return out


@pytest.mark.parametrize("settings,sampler", [
    (GREEDY, "rejection"),
    (SamplerSettings(temperature=0.9, top_p=0.9), "rejection"),
    (SamplerSettings(temperature=1.3, top_k=20), "seed-stable"),
])
def test_pipelined_baseline_equals_unpipelined(target, settings, sampler):
    """Baseline mode queues the next forward before reading a token: the same tokens as reading each
    token first (greedy and seeded sampling), invariants after every step, nothing queued past the budget."""
    for prompt in PROMPTS:
        for n in (1, 2, 9, 24):
            want = _sync_baseline(make_decoder(target, None, None, settings, sampler, seed=7), prompt, n)
            dec = make_decoder(target, None, None, settings, sampler, seed=7)
            got = run(dec, prompt, n)
            assert got == want, (prompt, n)
            assert dec._ahead is None  # the last step of the budget queues nothing
            dec.check_invariants()


def test_pipelined_baseline_stops_at_stop_id_with_one_forward_queued(target):
    """A stop id ends the output at once; the forward queued after it is left unused (invariants still hold)."""
    plain = run(make_decoder(target, None, None), PROMPTS[0], 20)
    stop = plain[5]
    k = plain.index(stop)
    dec = make_decoder(target, None, None, stop_ids=[stop])
    out = run(dec, PROMPTS[0], 20)
    assert out == plain[: k + 1] and dec.done
    if k > 0:  # the stop came from a step (not prefill), which queued one more forward
        assert dec._ahead is not None


def test_auto_plain_steps_are_pipelined_and_predicted(target):
    """While `auto` skips the drafter, a plain step queues the next one's forward; `next_is_plain`
    always matches the next `wants_draft`, so a queued forward never meets a draft round."""
    curve = CostCurve(verify_s=[1.0, 1.5, 1.7, 1.9, 2.1], draft_fixed_s=0.2, draft_per_token_s=0.02)
    sched = AutoScheduler(4, curve, use_confidence=False)
    dec = make_decoder(target, tiny.OracleDrafter(target, shift=1), 4, scheduler=sched)
    seen, wants = [], sched.wants_draft

    def spy():
        queued = dec._ahead is not None
        seen.append((queued, wants()))
        return seen[-1][1]

    sched.wants_draft = spy
    assert run(dec, PROMPTS[1], 60) == run(make_decoder(target, None, None), PROMPTS[1], 60)
    assert not any(queued and draft for queued, draft in seen)
    assert sum(queued for queued, _ in seen) > len(seen) // 2, seen
