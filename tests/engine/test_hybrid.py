"""The hybrid of a trained drafter and lookup (`--mode hybrid`) on the tiny model: the per-round choice
(`HybridScheduler`), greedy and seed-stable identity with plain decoding, the trained drafter's
context kept whole across rounds that skip its pass, and counters by the kind that drafted each round."""

import random

import mlx.core as mx
import pytest

from engine import spec as spec_module
from engine.api import SpecStats
from engine.lookup import HybridDrafter, LookupConfig, LookupDrafter, split_drafter
from engine.runtime import hybrid_scheduler
from engine.sampling import SamplerSettings
from engine.samplers import make_sampler
from engine.scheduler import AutoScheduler, CostCurve, HybridScheduler, LookupScheduler, Scheduler
from engine.seams import drafter_kind
from engine.spec import DecodeOptions, SpecDecoder
from tests.engine import tiny

GREEDY = SamplerSettings(temperature=0.0)
TIE_EPS = 1e-4  # as tests/engine/test_spec.py (docs/method.md §7.1)
# Prompts whose greedy continuations on the tiny target copy them often, and ones that do not.
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2], [7, 8, 9, 7, 8, 9, 7], [11, 40, 3, 11, 40, 3, 99, 11, 40],
           [1, 17, 42, 99, 5], [200, 3, 3, 3, 7, 8, 9, 10, 11, 12]]
# The study's verify curve (docs/lookup.md) with a trained drafter's pass at 0.2 of a step.
CURVE = CostCurve(verify_s=[1.0, 1.28, 1.37, 1.54, 1.63, 1.69, 1.86, 1.93, 2.02], draft_fixed_s=0.2,
                  draft_per_token_s=0.02)


@pytest.fixture(scope="module")
def target():
    return tiny.tiny_target(scale=4.0)


def hybrid(trained, max_drafts=4) -> HybridDrafter:
    return HybridDrafter(trained, LookupDrafter(LookupConfig(max_drafts=max_drafts)))


def decoder(target, drafter, settings=GREEDY, sampler="rejection", seed=0, scheduler=None) -> SpecDecoder:
    opts = DecodeOptions(make_sampler(settings, sampler, seed), stop_ids=frozenset())
    if scheduler is None and drafter is not None:
        scheduler = hybrid_scheduler(drafter, CURVE)
    return SpecDecoder(target, drafter, scheduler, opts, SpecStats(mode="hybrid", cap=4))


def run(dec, prompt, n, check=True, kinds=None):
    """Decode n tokens; check the invariants after every round; `kinds` collects each round's kind
    ("plain" for plain steps) from the stats."""
    out = dec.prefill(prompt)
    while len(out) < n:
        before = {k: v.rounds for k, v in dec.stats.by_kind.items()}
        out += dec.step(n - len(out))
        if check:
            dec.check_invariants()
        if kinds is not None:
            grown = [k for k, v in dec.stats.by_kind.items() if v.rounds > before.get(k, 0)]
            kinds.append(grown[0] if grown else "plain")
    return out


def first_divergence_gap(target, prompt, plain, out):
    """None when equal, else the top-1/top-2 logit gap of an uncached forward at the first divergence."""
    k = next((j for j, (a, b) in enumerate(zip(plain, out)) if a != b), None)
    if k is None:
        return None
    top = mx.sort(target.model(mx.array([prompt + plain[:k]]))[0, -1])[-2:].tolist()
    return top[1] - top[0]


# ---------------------------------------------------------------- the choice


def test_hybrid_drafter_kind_and_split():
    """The hybrid names both kinds; the decoder splits any drafter into (trained, lookup)."""
    trained, lookup = tiny.dspark_drafter(), LookupDrafter()
    both = HybridDrafter(trained, lookup)
    assert drafter_kind(both) == "dspark+lookup" and both.config is trained.config
    assert split_drafter(both) == (trained, lookup)
    assert split_drafter(lookup) == (None, lookup) and split_drafter(trained) == (trained, None)
    assert split_drafter(None) == (None, None)


def scheduler(trained_acc: float, lookup_rate: float, cap: int = 4) -> HybridScheduler:
    trained = AutoScheduler(cap, CURVE, use_confidence=False, prior=trained_acc)
    free = CostCurve(CURVE.verify_s, 0.0, 0.0)
    return HybridScheduler(trained, LookupScheduler(8, free, prior=lookup_rate))


def test_choice_follows_expected_tokens_per_second():
    """Lookup wins with a match when its rate at zero draft cost beats the trained drafter's with its
    pass; the trained drafter otherwise; a plain step when neither beats one, or nothing may be drafted."""
    assert scheduler(0.6, 0.6).choose(matched=8, limit=8) == "lookup"  # equal rates: lookup is free
    assert scheduler(0.9, 0.3).choose(matched=8, limit=8) == "trained"
    assert scheduler(0.6, 0.9).choose(matched=0, limit=8) == "trained"  # no match: no lookup round
    assert scheduler(0.05, 0.05).choose(matched=8, limit=8) is None
    assert scheduler(0.6, 0.9).choose(matched=8, limit=0) is None
    s = scheduler(0.6, 0.9)
    assert s.choose(matched=8, limit=8) == "lookup" and s.active is s.lookup
    s.begin_round(8)
    assert s.round_limit == s.lookup.round_limit and 1 <= s.round_limit <= 8


def test_shadow_rounds_teach_lookup():
    """Rounds lookup did not draft still move its rate: agreeing proposals raise it, and a
    disagreement at the first token lowers it; its own rounds are observed once, not shadowed."""
    s = scheduler(0.9, 0.3)
    start = s.lookup.rate
    for _ in range(6):
        assert s.choose(matched=4, limit=8) in ("trained", "lookup")
        s.shadow([5, 6, 7, 8], [5, 6, 7, 8, 9])
    assert s.lookup.rate > start and s.choose(matched=4, limit=8) == "lookup"
    high = s.lookup.rate
    s.active = s.trained
    s.shadow([1, 2], [3])
    assert s.lookup.rate < high
    s.active = s.lookup
    rate = s.lookup.rate
    s.shadow([1, 2], [3])
    assert s.lookup.rate == rate


# ---------------------------------------------------------------- identity with plain decoding


@pytest.mark.parametrize("layout", ["dspark", "dflash"])
def test_greedy_hybrid_equals_plain_greedy(target, layout):
    """Hybrid greedy ids equal plain greedy ids (a divergence only at a measured near-tie), with
    rounds of both kinds and plain steps over the prompts, and the invariants after every round."""
    trained = tiny.dspark_drafter() if layout == "dspark" else tiny.dflash_drafter(target)
    kinds = []
    for prompt in PROMPTS:
        plain = run(decoder(target, None), prompt, 30)
        out = run(decoder(target, hybrid(trained)), prompt, 30, kinds=kinds)
        gap = first_divergence_gap(target, prompt, plain, out)
        assert gap is None or gap <= TIE_EPS, (prompt, gap)
    assert {"lookup", layout} <= set(kinds), kinds


def test_seed_stable_hybrid_equals_plain_seed_stable(target):
    """With seed-stable sampling at T = 1 the hybrid emits exactly plain decoding's tokens per seed."""
    trained = tiny.dspark_drafter()
    t1 = SamplerSettings(temperature=1.0)
    for seed, prompt in enumerate(PROMPTS[:3]):
        plain = run(decoder(target, None, t1, "seed-stable", seed), prompt, 24)
        assert run(decoder(target, hybrid(trained), t1, "seed-stable", seed), prompt, 24) == plain


# ---------------------------------------------------------------- the trained drafter's context


class Coin(HybridScheduler):
    """Chooses each round's kind at random from a seeded generator (past-only, so lossless), to force
    long mixes of lookup rounds, trained rounds and plain steps whatever the estimates say; the
    rounds verify a fixed cap."""

    def __init__(self, seed: int, cap: int = 3, weights=(0.6, 0.3, 0.1)):
        super().__init__(Scheduler(cap), Scheduler(cap))
        self.rng, self.weights = random.Random(seed), weights

    def choose(self, matched, limit):
        self.active = None
        if limit < 1:
            return None
        pick = self.rng.choices(["lookup", "trained", None], self.weights)[0]
        if pick == "lookup" and not matched:
            pick = "trained"
        self.active = {"lookup": self.lookup, "trained": self.trained, None: None}[pick]
        return pick

    def next_is_plain(self):
        return False  # never decided a round early


@pytest.mark.parametrize("absorb_rows", [64, 3])
def test_context_survives_skipped_passes(target, monkeypatch, absorb_rows):
    """Every trained draft pass, including those after runs of lookup rounds and plain steps, sees
    the same hidden states as an uncached recompute over the taps of all committed positions; the
    drafter runs once per trained round only. absorb_rows=3 also absorbs pending rows between passes."""
    monkeypatch.setattr(spec_module, "ABSORB_ROWS", absorb_rows)
    trained = tiny.dspark_drafter()
    cfg = trained.config
    dec = decoder(target, hybrid(trained), scheduler=Coin(seed=1))
    seen = []
    real = trained.draft_hidden
    monkeypatch.setattr(trained, "draft_hidden", lambda h: (seen.append((h[0], list(dec.committed))), real(h))[1])
    kinds = []
    run(dec, PROMPTS[0], 60, kinds=kinds)
    after_skips = [i for i in range(1, len(kinds)) if kinds[i] == "dspark" and kinds[i - 1] != "dspark"]
    assert len(after_skips) >= 3 and kinds.count("lookup") >= 5, kinds
    assert len(seen) == kinds.count("dspark")  # no pass in lookup rounds or plain steps
    for h, committed in seen:
        p = len(committed) - 1
        _, taps = target.forward(mx.array([committed[:p]]), target.make_cache())  # uncached, all of them
        block = mx.array([[committed[-1]] + [cfg.mask_token_id] * (cfg.block_size - 1)])
        assert mx.allclose(h, trained.reference_forward(taps, block)[0], atol=1e-4).item()


def test_counters_by_the_kind_that_drafted(target):
    """by_kind counts each round under the kind that drafted it; the totals are their sums."""
    trained = tiny.dspark_drafter()
    dec = decoder(target, hybrid(trained), scheduler=Coin(seed=2))
    kinds = []
    run(dec, PROMPTS[1], 40, kinds=kinds)
    by_kind, st = dec.stats.by_kind, dec.stats
    assert set(by_kind) == {"lookup", "dspark"}
    assert by_kind["lookup"].rounds == kinds.count("lookup") and by_kind["dspark"].rounds == kinds.count("dspark")
    assert sum(k.drafted_tokens for k in by_kind.values()) == st.drafted_tokens
    assert sum(k.accepted_tokens for k in by_kind.values()) == st.accepted_tokens
    assert st.rounds == len(kinds) and by_kind["lookup"].empty_rounds == 0
