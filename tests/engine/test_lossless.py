"""End-to-end losslessness at temperature > 0 with negative controls (docs/method.md, "Testing losslessness").

A tiny random target with a 6-token vocabulary and a deliberately poor random DSpark drafter (many
rejections, residual and bonus draws). The exact joint distribution of the first 3 generated
tokens comes from the chain rule over uncached target forwards; N independent speculative
generations must fit it (chi-square and TV), and each broken variant must not.
"""

import math
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from engine import sampling
from engine.api import SpecStats
from engine.models.drafter_config import normalize_drafter_config
from engine.scheduler import AutoScheduler, CostCurve, Scheduler, ThresholdScheduler
from engine.samplers import RejectionSampler, make_sampler
from engine.spec import DecodeOptions, SpecDecoder
from tests.engine import drafter_fixtures as fx
from tests.engine import joint, tiny
from tests.stats import assert_detected, assert_fits

# Sized to what the exact one-step tests (test_sampling.py) leave open, the wiring of rounds
# (joint.DRAWS; docs/method.md 7.3).
V, L, PROMPT = tiny.LOSSLESS_VOCAB, 3, [1, 2, 3]
N = N_CONTROL = joint.DRAWS
MASK = V - 1
# Each step may commit past the first L tokens, so rounds of several drafts (the Markov chain
# between drafts, partial acceptance, the bonus after a full accept) shape the L tokens tested.
BUDGET = 6


class PeakedDrafter:
    """Duck-typed drafter with q = 0.7 on token (prev + 1) % V and the rest spread evenly.

    A dominant but not certain draft token is where a scheduler that peeks at x_k biases the
    output most, so the peeking control has power.
    """

    has_markov, has_confidence = True, False

    def __init__(self):
        self.config = normalize_drafter_config(fx.deepspec_config(vocab_size=V, mask_token_id=MASK))

    def make_cache(self):
        return [0]

    @staticmethod
    def context_length(cache):
        return cache[0]

    def backbone(self, ctx_new, block_ids, cache):
        cache[0] += 0 if ctx_new is None else ctx_new.shape[1]
        return mx.zeros((1, self.config.block_size, 1))

    def draft_hidden(self, h):
        return h

    def base_logits(self, h):
        return mx.zeros(h.shape[:-1] + (V,))

    def markov_bias(self, prev_ids, *_):
        q = mx.full((V,), 0.3 / (V - 1)).at[(prev_ids[0] + 1) % V].add(0.7 - 0.3 / (V - 1))
        return mx.log(q)[None]


TARGET, DRAFTER = tiny.lossless_target(), tiny.lossless_drafter()


def exact_joint(settings: sampling.SamplerSettings) -> np.ndarray:
    """P(first L generated tokens) [V**L] by the chain rule over full uncached forwards."""
    return joint.exact_joint(TARGET, PROMPT, settings, V, L)


def sample_joint(settings, make_scheduler, decoder_cls=SpecDecoder, n=N, drafter=None, sampler_cls=None,
                 prefix=None) -> np.ndarray:
    """Joint-cell index of the first L tokens of n independent speculative generations.

    The prompt's forward pass is the same for every seed, so it runs once (`read_prompt`); each
    generation is a `fork` of that state that samples its own first token, then runs real rounds.
    `sampler_cls(settings, seed)` replaces the rejection sampler (negative controls). `prefix`
    (PrefixState, n): the prompt's first n positions are restored from that prefix-cache state.
    """
    drafter = drafter or DRAFTER
    make = sampler_cls or (lambda s, seed: make_sampler(s, "rejection", seed))
    template = decoder_cls(TARGET, drafter, make_scheduler(), DecodeOptions(make(settings, 0), frozenset()),
                           SpecStats(mode="dspark", cap=4))
    template.read_prompt(PROMPT, prefix)
    fork = lambda seed: (DecodeOptions(make(settings, seed), frozenset()), make_scheduler(),  # noqa: E731
                         SpecStats(mode="dspark", cap=4))
    return joint.sample_cells(template, fork, n, BUDGET, V, L)


T1 = sampling.SamplerSettings(temperature=1.0)
T07 = sampling.SamplerSettings(temperature=0.7, top_p=0.9)
CURVE = CostCurve(verify_s=[1.0, 1.1, 1.2, 1.3, 1.4], draft_fixed_s=0.1, draft_per_token_s=0.01)
SCHEDULERS = {
    "cap1": lambda: Scheduler(1),
    "cap4": lambda: Scheduler(4),
    "threshold": lambda: ThresholdScheduler(4, 0.3),
    "auto-confidence": lambda: AutoScheduler(4, CURVE, use_confidence=True),
}


@pytest.fixture(scope="module")
def exact():
    return {"T1": exact_joint(T1), "T07": exact_joint(T07)}


@pytest.mark.parametrize("name", ["cap1", "cap4", "threshold"])
def test_joint_distribution_t1(exact, name):
    """T=1: speculative output fits the exact joint distribution for fixed, threshold and auto caps."""
    assert_fits(sample_joint(T1, SCHEDULERS[name]), exact["T1"])


@pytest.mark.parametrize("name", ["auto-confidence"])
def test_joint_distribution_t07_top_p(exact, name):
    """T=0.7 with top-p 0.9 applied to the target exactly as in baseline decoding."""
    assert_fits(sample_joint(T07, SCHEDULERS[name]), exact["T07"])


def test_control_residual_from_p(exact, monkeypatch):
    """Negative control: resampling from p instead of max(0, p - q) is detected."""
    monkeypatch.setattr(sampling, "residual_probs", lambda p, q: p)
    assert_detected(sample_joint(T1, SCHEDULERS["cap4"], n=N_CONTROL), exact["T1"])


class BonusFromQ(RejectionSampler):
    """Broken: when every draft passes, the bonus token is redrawn from the last draft's q, not p."""

    def accept(self, draft_ids, draft_logprobs, target_logits, anchor):
        n, token = super().accept(draft_ids, draft_logprobs, target_logits, anchor)
        if draft_ids and n == len(draft_ids):
            key = sampling.mix_key(self.seed, 99, anchor)
            token = sampling.categorical_token(draft_logprobs[n - 1], key).item()
        return n, token


class MarkovSpy:
    """The drafter, recording the Markov bias of the draft row formed last."""

    def __init__(self, drafter):
        self._drafter, self.last_bias = drafter, None

    def __getattr__(self, name):
        return getattr(self._drafter, name)

    def markov_bias(self, *args, **kwargs):
        self.last_bias = self._drafter.markov_bias(*args, **kwargs)  # [1, V]
        return self.last_bias


def q_without_markov(spy: MarkovSpy):
    """A rejection sampler class whose q for the accept rule omits the Markov bias (broken)."""
    class NoMarkovQ(RejectionSampler):
        def draft_token(self, logits, position):
            token, _ = super().draft_token(logits, position)
            return token, sampling.process_logits(logits - spy.last_bias[0], self.settings)

    return NoMarkovQ


def test_control_no_bonus(exact):
    """Negative control: replacing the bonus draw with a resample from q is detected."""
    assert_detected(sample_joint(T1, SCHEDULERS["cap1"], n=joint.DRAWS_FAR, sampler_cls=BonusFromQ), exact["T1"])


def test_control_q_without_markov(exact):
    """Negative control: verifying with q that omits the Markov bias is detected."""
    spy = MarkovSpy(DRAFTER)
    cells = sample_joint(T1, SCHEDULERS["cap4"], n=N_CONTROL, drafter=spy, sampler_cls=q_without_markov(spy))
    assert_detected(cells, exact["T1"])


def test_control_peeking_scheduler(exact):
    """Negative control: a scheduler that looks at x_k before admitting it is detected."""
    class Peeking(SpecDecoder):
        def draft(self, limit):
            ids, logq = super().draft(limit)
            # Retrospective truncation: verify a draft only if it was a likely one (q(x_k) > 0.5).
            keep = 0
            while keep < len(ids) and logq[keep, ids[keep]].item() > math.log(0.5):
                keep += 1
            return ids[:keep], (logq[:keep] if keep else None)

    # The same drafter with an honest scheduler passes, so the failure is the peeking alone.
    assert_fits(sample_joint(T1, SCHEDULERS["cap4"], n=N_CONTROL, drafter=PeakedDrafter()), exact["T1"])
    assert_detected(sample_joint(T1, SCHEDULERS["cap4"], Peeking, n=N_CONTROL, drafter=PeakedDrafter()), exact["T1"])


def prefix_state(tokens: list[int], label: list[int] | None = None):
    """A prefix-cache state of the caches after reading `tokens` (its tokens relabeled `label`: a
    state that claims positions it does not hold, for the control)."""
    dec = SpecDecoder(TARGET, DRAFTER, Scheduler(4), DecodeOptions(make_sampler(T1, "rejection", 0), frozenset()),
                      SpecStats(mode="dspark", cap=4))
    dec.read_prompt(tokens)
    state = dec.capture()
    return state if label is None else replace(state, tokens=np.array(label))


def test_joint_distribution_with_a_restored_prefix(exact):
    """The prompt's first two positions restored from the prefix cache (target and drafter context,
    taken from a request that went on differently): the output still fits the exact joint."""
    state = prefix_state(PROMPT[:2] + [5, 4, 0])
    assert_fits(sample_joint(T1, SCHEDULERS["cap4"], prefix=(state, 2)), exact["T1"])


def test_control_restored_wrong_prefix(exact):
    """Negative control: a state holding another prompt's positions, restored as this one's, is detected."""
    state = prefix_state([4, 0, 5], label=PROMPT[:2] + [5])
    assert_detected(sample_joint(T1, SCHEDULERS["cap4"], n=joint.DRAWS_FAR, prefix=(state, 2)), exact["T1"])
