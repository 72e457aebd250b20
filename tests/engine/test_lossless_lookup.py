"""Lookup drafts at temperature > 0 are lossless: the exact joint distribution, and negative controls
(docs/method.md §5.6 and §7.3).

A tiny random target with a 6-token vocabulary. The prompt holds every pair of tokens, so with
2-token matches every round drafts (from whatever followed the pair last), and many drafts are
unlikely under the target: rejections, recoveries from p without x, and bonus draws are all frequent.
With 3-token matches only some rounds match, and the others are plain steps. The exact probability
of each of the 6^3 possible first 3 generated tokens comes from the chain rule over uncached target
forwards; independent generations must fit it, and each broken accept rule must not.
"""


import mlx.core as mx
import numpy as np
import pytest

from engine import sampling
from engine.api import SpecStats
from engine.lookup import LookupConfig, LookupDrafter
from engine.samplers import RejectionSampler, make_sampler
from engine.scheduler import CostCurve, LookupScheduler, Scheduler
from engine.spec import DecodeOptions, SpecDecoder
from tests.engine import joint, tiny
from tests.stats import assert_detected, assert_fits

V, L = tiny.LOSSLESS_VOCAB, 3
N = N_CONTROL = joint.DRAWS  # docs/method.md 7.3
BUDGET = 6  # each step may draft beyond the first L tokens, so multi-draft rounds shape them


def de_bruijn_pairs(vocab: int) -> list[int]:
    """A shortest sequence holding every ordered pair of tokens < vocab once (length vocab^2 + 1)."""
    seq, seen, current = [0], set(), 0
    while len(seen) < vocab * vocab:
        nxt = next(t for t in reversed(range(vocab)) if (current, t) not in seen)
        seen.add((current, nxt))
        seq.append(nxt)
        current = nxt
    return seq


PROMPT = de_bruijn_pairs(V)
T1 = sampling.SamplerSettings(temperature=1.0)
CURVE = CostCurve(verify_s=[1.0, 1.28, 1.37, 1.54, 1.63], draft_fixed_s=0.0, draft_per_token_s=0.0)


TARGET = tiny.lossless_target(taps=False)


def exact_joint(settings: sampling.SamplerSettings) -> np.ndarray:
    """P(first L generated tokens) [V**L] by the chain rule over full uncached forwards."""
    return joint.exact_joint(TARGET, PROMPT, settings, V, L)


def sample_joint(make_scheduler, n=N, min_ngram=2, sampler_cls=None, stats=None) -> np.ndarray:
    """Joint-cell index of the first L tokens of n independent lookup generations, forked from one
    prompt pass (`SpecDecoder.fork`); `sampler_cls(settings, seed)` replaces the rejection sampler."""
    make = sampler_cls or (lambda s, seed: make_sampler(s, "rejection", seed))
    drafter = LookupDrafter(LookupConfig(min_ngram=min_ngram, max_ngram=3, max_drafts=4))
    stats = stats if stats is not None else SpecStats(mode="lookup", cap=4)
    template = SpecDecoder(TARGET, drafter, make_scheduler(), DecodeOptions(make(T1, 0), frozenset()), stats)
    template.read_prompt(PROMPT)
    fork = lambda seed: (DecodeOptions(make(T1, seed), frozenset()), make_scheduler(), stats)  # noqa: E731
    return joint.sample_cells(template, fork, n, BUDGET, V, L)


@pytest.fixture(scope="module")
def exact():
    return exact_joint(T1)


SCHEDULERS = {"cap1": lambda: Scheduler(1), "cap4": lambda: Scheduler(4), "auto": lambda: LookupScheduler(4, CURVE)}


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_joint_distribution_every_round_drafts(exact, name):
    """2-token matches: every round drafts; the output fits the exact joint law at fixed and adaptive caps."""
    stats = SpecStats(mode="lookup", cap=4)
    assert_fits(sample_joint(SCHEDULERS[name], stats=stats), exact)
    kind = stats.by_kind["lookup"]
    assert kind.empty_rounds == 0 and 0 < kind.accepted_tokens < kind.drafted_tokens


def test_joint_distribution_some_rounds_plain(exact):
    """3-token matches only: a mix of drafting rounds and plain steps fits it too."""
    stats = SpecStats(mode="lookup", cap=4)
    assert_fits(sample_joint(SCHEDULERS["cap4"], min_ngram=3, stats=stats), exact)
    kind = stats.by_kind["lookup"]
    assert kind.empty_rounds > 0 and kind.rounds > 0


class ResidualFromP(RejectionSampler):
    """Broken: after a rejection the token is redrawn from p itself (it may be the rejected draft
    again), not from p with the draft removed."""

    def accept(self, draft_ids, draft_logprobs, target_logits, anchor):
        n, token = super().accept(draft_ids, draft_logprobs, target_logits, anchor)
        if n < len(draft_ids):
            logp = sampling.process_logits(target_logits[n], self.settings)  # [V]
            token = sampling.categorical_token(logp, sampling.mix_key(self.seed, 98, anchor)).item()
        return n, token


class HalfMassQ(RejectionSampler):
    """Broken: verifies a lookup draft as if it had been drawn with probability 1/2 (the rest spread
    evenly), so it is accepted with min(1, 2 p(x)) and recovered from max(0, p - q)."""

    def point_mass(self, draft_ids, vocab):
        q = mx.full((len(draft_ids), vocab), 0.5 / (vocab - 1))  # [l, V]
        hot = mx.arange(vocab)[None] == mx.array(draft_ids)[:, None]  # [l, V]
        return mx.log(mx.where(hot, 0.5, q))


def test_control_residual_from_p(exact):
    """Negative control: recovering from p instead of p without the draft is detected."""
    assert_detected(sample_joint(SCHEDULERS["cap4"], n=N_CONTROL, sampler_cls=ResidualFromP), exact)


def test_control_wrong_acceptance_probability(exact):
    """Negative control: accepting a draft with min(1, 2 p(x)) instead of p(x) is detected."""
    assert_detected(sample_joint(SCHEDULERS["cap4"], n=joint.DRAWS_FAR, sampler_cls=HalfMassQ), exact)
