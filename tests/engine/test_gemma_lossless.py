"""The exact-distribution test on a Gemma-family target (docs/method.md §7.3), and its control.

A tiny random Gemma-4 over 6 tokens whose sliding-window layers see 3 positions, so every sampled
sequence crosses the window edge with rounds rolled back across it (engine/models/window_cache.py).
N speculative generations of the first 3 tokens at T = 1 must fit the exact joint law from the
chain rule over uncached forwards; resampling a rejection from p instead of max(0, p - q) must not.
"""

import pytest

from engine import sampling
from engine.api import SpecStats
from engine.samplers import make_sampler
from engine.scheduler import Scheduler
from engine.spec import DecodeOptions, SpecDecoder
from tests.engine import joint, tiny
from tests.engine import tiny_gemma as tg
from tests.stats import assert_detected, assert_fits

pytest.importorskip("mlx_vlm")

V, L, PROMPT, BUDGET, CAP = tiny.LOSSLESS_VOCAB, 3, [1, 2, 3], 6, 4
N = N_CONTROL = joint.DRAWS  # docs/method.md 7.3
T1 = sampling.SamplerSettings(temperature=1.0)


@pytest.fixture(scope="module")
def target():
    return tg.gemma_target(tg.tiny_gemma4(seed=7, vocab=V, scale=0.5, window=3), taps=(0, 1), max_rollback=CAP + 1)


@pytest.fixture(scope="module")
def exact(target):
    return joint.exact_joint(target, PROMPT, T1, V, L)


def sample(target, n):
    make = lambda seed: make_sampler(T1, "rejection", seed)  # noqa: E731
    template = SpecDecoder(target, tiny.lossless_drafter(), Scheduler(CAP), DecodeOptions(make(0), frozenset()),
                           SpecStats(mode="dspark", cap=CAP))
    template.read_prompt(PROMPT)
    fork = lambda seed: (DecodeOptions(make(seed), frozenset()), Scheduler(CAP), SpecStats(mode="dspark", cap=CAP))  # noqa: E731
    return joint.sample_cells(template, fork, n, BUDGET, V, L)


def test_joint_distribution_on_a_gemma_target(target, exact):
    assert_fits(sample(target, N), exact)


def test_control_residual_from_p_on_a_gemma_target(target, exact, monkeypatch):
    monkeypatch.setattr(sampling, "residual_probs", lambda p, q: p)
    assert_detected(sample(target, N_CONTROL), exact)
