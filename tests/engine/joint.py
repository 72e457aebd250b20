"""The joint law of a decoder's first L generated tokens, exact and sampled, for the
exact-distribution tests (test_lossless*.py, test_hybrid_lossless.py).

Each sequence of L tokens is one cell of a [V**L] histogram. The exact law comes from the chain
rule over full uncached forwards of the target; samples come from real decoders forked from one
prompt pass, so each test only says which decoder, sampler and scheduler it draws with.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from engine import sampling
from engine.models.target import Target
from engine.spec import SpecDecoder

# Generations a sampled joint draws, for positive fits and negative controls alike. A control is a
# positive fit with one defect injected, drawn with the same seeds; every control in the suite is
# detected at this size with a p-value below tests.stats.DETECTED (1e-6), 100x below the fits' ALPHA,
# so a positive fit of this size fails on each known defect too (docs/method.md 7.3).
DRAWS = 1000
# Controls whose defect moves much more mass draw this many: each is detected below p = 1e-9 at 300
# draws (measured on 2026-12-07; docs/method.md 7.3), 1000x under tests.stats.DETECTED.
DRAWS_FAR = 300


def exact_joint(target: Target, prompt: list[int], settings: sampling.SamplerSettings, vocab: int,
                length: int) -> np.ndarray:
    """P(first `length` generated tokens) [vocab**length] by the chain rule over full uncached forwards."""
    probs = np.zeros(vocab**length)
    for i, seq in enumerate(itertools.product(range(vocab), repeat=length)):
        ids = mx.array([prompt + list(seq[:-1])])
        logp = sampling.process_logits(target.logits(ids)[0, len(prompt) - 1 :], settings)  # [length, vocab]
        probs[i] = float(mx.exp(sum(logp[k, seq[k]] for k in range(length))).item())
    return probs / probs.sum()


def sample_cells(template: SpecDecoder, fork_args: Callable[[int], tuple], n: int, budget: int, vocab: int,
                 length: int) -> np.ndarray:
    """Cell indices [n] of the first `length` tokens of n generations, each a `fork` of `template`
    (after its `read_prompt`) with `fork_args(seed)` = (opts, scheduler, stats), stepped with `budget`."""
    cells = []
    for seed in range(n):
        dec = template.fork(*fork_args(seed))
        out = dec.first_token()
        while len(out) < length:
            out += dec.step(budget)
        cells.append(int(np.ravel_multi_index(out[:length], (vocab,) * length)))
    return np.array(cells)
