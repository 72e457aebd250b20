"""The hybrid (trained drafter + lookup, chosen per round) is lossless at temperature > 0: the exact
joint distribution of the first tokens, and a negative control (docs/method.md §3.5, §5.6, §7.3).

As tests/engine/test_lossless_lookup.py: a tiny random target with a 6-token vocabulary, and a
prompt holding every token pair, so lookup has a match every round. The trained drafter is a poor
random DSpark drafter with a strong Markov bias (test_lossless.py's), so both kinds' drafts are
often rejected. Each round is verified with its own kind's draft distribution: the point mass for
lookup, the drafter's q for the drafter. Generations with the real `HybridScheduler` and with a
random past-only choice of kind must fit the exact law; a hybrid that picks the kind after seeing
the drafter's sample must not (with a drafter whose q is spread enough for that to matter).
"""


import mlx.core as mx
import numpy as np
import pytest

from engine import sampling
from engine.api import SpecStats
from engine.lookup import HybridDrafter, LookupConfig, LookupDrafter
from engine.models.drafter_config import normalize_drafter_config
from engine.samplers import make_sampler
from engine.scheduler import AutoScheduler, CostCurve, HybridScheduler, LookupScheduler
from engine.spec import DecodeOptions, SpecDecoder
from tests.engine import drafter_fixtures as fx
from tests.engine.test_hybrid import Coin
from tests.engine.test_lossless_lookup import de_bruijn_pairs
from tests.engine import joint, tiny
from tests.stats import assert_detected, assert_fits

V, L = tiny.LOSSLESS_VOCAB, 3
N = N_CONTROL = joint.DRAWS  # docs/method.md 7.3
BUDGET = 6  # rounds may draft beyond the first L tokens, so multi-draft rounds shape them
PROMPT = de_bruijn_pairs(V)
T1 = sampling.SamplerSettings(temperature=1.0)
CURVE = CostCurve(verify_s=[1.0, 1.28, 1.37, 1.54, 1.63], draft_fixed_s=0.2, draft_per_token_s=0.02)


TARGET, DRAFTER = tiny.lossless_target(), tiny.lossless_drafter()
HYBRID = HybridDrafter(DRAFTER, LookupDrafter(LookupConfig(min_ngram=2, max_ngram=3, max_drafts=4)))


def real_scheduler() -> HybridScheduler:
    """The hybrid's own choice, with priors that start on the trained drafter (0.65 against lookup's
    0.5) so the first round's outcome and shadow decide the next: both kinds draft many rounds."""
    trained = AutoScheduler(4, CURVE, use_confidence=True, prior=0.65)
    return HybridScheduler(trained, LookupScheduler(4, CostCurve(CURVE.verify_s, 0.0, 0.0), prior=0.5))


SCHEDULERS = {"hybrid": lambda seed: real_scheduler(), "coin": lambda seed: Coin(seed, weights=(0.45, 0.45, 0.1))}


def exact_joint() -> np.ndarray:
    """P(first L generated tokens) [V**L] by the chain rule over full uncached forwards."""
    return joint.exact_joint(TARGET, PROMPT, T1, V, L)


def sample_joint(make_scheduler, n=N, decoder_cls=SpecDecoder, stats=None, drafter=HYBRID) -> np.ndarray:
    """Joint-cell index of the first L tokens of n independent hybrid generations, forked from one
    prompt pass; `make_scheduler(seed)` gives each its scheduler."""
    stats = stats if stats is not None else SpecStats(mode="hybrid", cap=4)
    opts = lambda seed: DecodeOptions(make_sampler(T1, "rejection", seed), frozenset())  # noqa: E731
    template = decoder_cls(TARGET, drafter, make_scheduler(0), opts(0), stats)
    template.read_prompt(PROMPT)
    return joint.sample_cells(template, lambda seed: (opts(seed), make_scheduler(seed), stats), n, BUDGET, V, L)


@pytest.fixture(scope="module")
def exact():
    return exact_joint()


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_joint_distribution(exact, name):
    """Mixed lookup and trained rounds (and plain steps) fit the exact joint law at T = 1."""
    stats = SpecStats(mode="hybrid", cap=4)
    assert_fits(sample_joint(SCHEDULERS[name], stats=stats), exact)
    lookup, trained = stats.by_kind["lookup"], stats.by_kind["dspark"]
    assert lookup.rounds > 100 and trained.rounds > 100, (lookup, trained)
    assert 0 < lookup.accepted_tokens < lookup.drafted_tokens and 0 < trained.accepted_tokens < trained.drafted_tokens


class SpreadDrafter:
    """Duck-typed trained drafter with q = 0.5 on token (prev + 1) % V and 0.1 on each other token.

    A likely but not certain draft is where a choice that peeks at the draft biases the output most
    (the random drafter's q is nearly one-hot, which would hide the control's bias)."""

    has_markov, has_confidence = True, False

    def __init__(self):
        self.config = normalize_drafter_config(fx.deepspec_config(vocab_size=V, mask_token_id=V - 1))

    def make_cache(self):
        return [0]

    @staticmethod
    def context_length(cache):
        return cache[0]

    def append_context(self, ctx_new, cache):
        cache[0] += ctx_new.shape[1]

    def backbone(self, ctx_new, block_ids, cache):
        cache[0] += 0 if ctx_new is None else ctx_new.shape[1]
        return mx.zeros((1, self.config.block_size, 1))

    def draft_hidden(self, h):
        return h

    def base_logits(self, h, vocab=None):
        return mx.zeros(h.shape[:-1] + (V,))

    def markov_bias(self, prev_ids, *_):
        q = mx.full((V,), 0.1).at[(prev_ids[0] + 1) % V].add(0.4)  # [V]
        return mx.log(q)[None]


class PeekingHybrid(SpecDecoder):
    """Broken: runs the trained drafter, then hands the round to lookup when the drafter's first draft
    equals lookup's (as if to avoid verifying the same token twice over). The choice of kind looks
    at the drafter's sample x_1, so the rounds it keeps verify x_1 with q although x_1 was drawn from
    q conditioned on differing from lookup's draft (docs/method.md §6.1)."""

    def draft(self, limit):
        if self._round_kind == "lookup":
            return super().draft(limit)
        ids, logq = super().draft(limit)
        proposal = self._index.propose(1)
        if ids and proposal and ids[0] == proposal[0]:
            self._round_kind, self.scheduler.active = "lookup", self.scheduler.lookup
            return self._lookup_draft(limit)
        return ids, logq


def test_control_choice_after_the_drafters_sample(exact):
    """Negative control: choosing the kind after seeing the trained drafter's first draft is detected;
    the same drafter with the honest choice passes, so the failure is the peeking alone."""
    coin = lambda seed: Coin(seed, weights=(0.0, 1.0, 0.0))  # noqa: E731  (every round asks the drafter first)
    spread = HybridDrafter(SpreadDrafter(), HYBRID.lookup)
    assert_fits(sample_joint(coin, n=N_CONTROL, drafter=spread), exact)
    assert_detected(sample_joint(coin, n=N_CONTROL, decoder_cls=PeekingHybrid, drafter=spread), exact)
