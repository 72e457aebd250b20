"""Losslessness at temperature 1 with strong penalties on (test_lossless.py's design, docs/method.md §7.3).

The tiny 6-token target and the poor random DSpark drafter of test_lossless.py; the exact joint
distribution of the first 3 generated tokens comes from the chain rule over uncached target
forwards, each row processed by the numpy rules of test_processors.py with its own history. N
speculative generations must fit it, for rejection and seed-stable sampling. Negative control:
verify rows that ignore the round's draft prefix (every row with the committed history only).
"""

import itertools

import mlx.core as mx
import numpy as np
import pytest

from engine import processors
from engine.api import SpecStats
from engine.processors import ProcessorSettings
from engine.sampling import SamplerSettings
from engine.samplers import make_sampler
from engine.spec import DecodeOptions, SpecDecoder
from tests.engine.test_lossless import BUDGET, DRAFTER, L, N, N_CONTROL, PROMPT, SCHEDULERS, TARGET, V
from tests.engine import joint
from tests.engine.test_processors import reference
from tests.stats import assert_detected, assert_fits

T1 = SamplerSettings(temperature=1.0)
# Strong enough that a wrong history moves probability mass visibly in 1500 draws.
PENALTIES = ProcessorSettings(presence_penalty=1.0, frequency_penalty=1.5, repetition_penalty=1.5)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def exact_joint(procs: ProcessorSettings) -> np.ndarray:
    """P(first L generated tokens) [V**L] at T=1 by the chain rule; row k has history PROMPT, seq[:k]."""
    probs = np.zeros(V**L)
    for i, seq in enumerate(itertools.product(range(V), repeat=L)):
        raw = np.array(TARGET.model(mx.array([PROMPT + list(seq[:-1])]))[0, len(PROMPT) - 1 :])  # [L, V]
        logp = [log_softmax(reference(raw[k], PROMPT, list(seq[:k]), procs))[seq[k]] for k in range(L)]
        probs[i] = np.exp(sum(logp))
    return probs / probs.sum()


def sample_joint(procs: ProcessorSettings, sampler: str, n: int) -> np.ndarray:
    """Joint-cell index of the first L tokens of n speculative generations (cap 4, one per seed).

    As in test_lossless.sample_joint, the prompt's forward runs once and each generation forks it.
    """
    def opts(seed):
        return DecodeOptions(make_sampler(T1, sampler, seed), frozenset(), processors=procs)

    template = SpecDecoder(TARGET, DRAFTER, SCHEDULERS["cap4"](), opts(0), SpecStats(mode="dspark", cap=4))
    template.read_prompt(PROMPT)
    fork = lambda seed: (opts(seed), SCHEDULERS["cap4"](), SpecStats(mode="dspark", cap=4))  # noqa: E731
    return joint.sample_cells(template, fork, n, BUDGET, V, L)


@pytest.fixture(scope="module")
def exact():
    probs = exact_joint(PENALTIES)
    plain = exact_joint(ProcessorSettings())
    # The penalties reshape the joint a lot, so fitting it says something.
    assert 0.5 * np.abs(probs - plain).sum() > 0.2
    return probs


@pytest.mark.parametrize("sampler", ["rejection", "seed-stable"])
def test_joint_distribution_with_penalties(exact, sampler):
    """T=1, presence + frequency + repetition penalties: speculative output fits the exact joint."""
    assert_fits(sample_joint(PENALTIES, sampler, N), exact)


def test_control_verify_rows_ignore_drafts(exact, monkeypatch):
    """Negative control: every verify row penalised with the committed history alone is detected."""
    monkeypatch.setattr(processors, "draft_history", lambda drafts, vocab: mx.zeros((drafts.shape[0] + 1, vocab)))
    assert_detected(sample_joint(PENALTIES, "rejection", N_CONTROL), exact)
