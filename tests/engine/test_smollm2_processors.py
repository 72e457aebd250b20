"""Logit processors on the real default model (SmolLM2-135M, fp32), greedy: for each processor the
baseline decode follows the processed target (checked against one uncached forward and the numpy
rules), and speculative decoding with an oracle drafter (mixed accept lengths, roll-backs, bonuses)
and with random DSpark/DFlash drafters gives the same tokens up to measured near-ties."""

import mlx.core as mx
import numpy as np
import pytest

from engine.api import SpecStats
from engine.processors import ProcessorSettings
from engine.sampling import SamplerSettings
from engine.scheduler import Scheduler
from engine.samplers import make_sampler
from engine.spec import DecodeOptions, SpecDecoder
from engine.text import apply_chat_template
from tests.engine import tiny
from tests.engine.smollm2_cases import QUESTIONS
from tests.engine.test_processors import reference

TIE_EPS = 1e-4
N_TOKENS = 40  # baseline and oracle runs
N_RANDOM = 12  # random drafters: ~1 token per round at greedy, and each round drafts 4 rows
VOCAB = 49152
# (question, processor). Each question was picked so that its greedy output has a position where
# the penalty of the token just before changes the argmax: a row that missed its latest history (a
# queued plain step's lazy token, a verify row's draft prefix) changes the output there. 504 is
# "The", the greedy first token of QUESTIONS[3]; " colors" (4683) then appears in the biased answer.
CASES = {
    "presence": ("List the vowels separated by commas.", ProcessorSettings(presence_penalty=1.5)),
    "frequency": (QUESTIONS[12], ProcessorSettings(frequency_penalty=1.0)),
    "repetition": ("Spell the word banana letter by letter.", ProcessorSettings(repetition_penalty=1.3)),
    "logit-bias": (QUESTIONS[3], ProcessorSettings(logit_bias=((504, -100.0), (4683, 5.0)))),
}


def decode(target, prompt, n, procs, drafter=None, logprobs=None):
    """Greedy decode of n tokens (baseline when drafter is None); invariants checked every round.
    Returns (tokens, decoder, per-token logprobs or None)."""
    opts = DecodeOptions(make_sampler(SamplerSettings(), "rejection", 0), frozenset(), processors=procs, logprobs=logprobs)
    dec = SpecDecoder(target, drafter, None if drafter is None else Scheduler(4), opts,
                      SpecStats(mode="baseline" if drafter is None else "dspark", cap=4))
    if isinstance(drafter, tiny.OracleDrafter):
        drafter.committed = dec.committed_view()
    out = dec.prefill(prompt)
    lps = None if logprobs is None else list(dec.last_logprobs)
    while len(out) < n and not dec.done:
        new = dec.step(n - len(out))
        out += new
        if lps is not None:
            assert len(dec.last_logprobs) == len(new)
            lps += dec.last_logprobs
        dec.check_invariants()
    return out, dec, lps


def teacher_forced(target, prompt, out, procs) -> tuple[np.ndarray, np.ndarray]:
    """(raw, processed) logits [n, V] of each output position from ONE uncached forward of
    prompt + output; processed row i has its own history (prompt, out[:i]) through the numpy rules."""
    raw = np.array(target.model(mx.array([prompt + out]))[0, len(prompt) - 1 : -1])  # [n, V]
    return raw, np.stack([reference(raw[i], prompt, out[:i], procs) for i in range(len(out))])


def gap(row: np.ndarray) -> float:
    top = np.sort(row)[-2:]
    return float(top[1] - top[0])


def assert_tie_aware_equal(reference_out, out, rows, label):
    """Same tokens, or the first divergence sits at a measured near-tie of the processed logits."""
    k = next((j for j, (a, b) in enumerate(zip(reference_out, out)) if a != b), None)
    assert k is None or gap(rows[k]) <= TIE_EPS, (label, k, gap(rows[k]))


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_equivalence_with_processor(smollm2, name):
    """Baseline (pipelined plain steps) = argmax of the processed target at every position; the
    oracle and random drafters reproduce it; and the processor did change the output."""
    target, tok, dspark, dflash = smollm2
    question, procs = CASES[name]
    prompt = apply_chat_template(tok, [{"role": "user", "content": question}])
    base, _, _ = decode(target, prompt, N_TOKENS, procs)
    raw, rows = teacher_forced(target, prompt, base, procs)  # [n, V] each
    for i, row in enumerate(rows):
        assert row[base[i]] >= row.max() - TIE_EPS, (name, i, row.max() - row[base[i]])
    # Without the processor some token of this output would clearly not have been chosen.
    assert max(r.max() - r[t] for r, t in zip(raw, base)) > 1.0, "the processor changed nothing"

    # Every 3rd position corrupted: mixed accept lengths, rejections, roll-backs and bonus tokens.
    oracle = tiny.OracleDrafter(target, reference=prompt + base, corrupt_every=3, vocab=VOCAB)
    out, dec, _ = decode(target, prompt, N_TOKENS, procs, oracle)
    assert 0 < dec.stats.accepted_tokens < dec.stats.drafted_tokens
    assert_tie_aware_equal(base, out, rows, (name, "oracle"))
    for label, drafter in (("dspark", dspark), ("dflash", dflash)):
        out, dec, _ = decode(target, prompt, N_RANDOM, procs, drafter)
        assert dec.stats.drafted_tokens > 0
        assert_tie_aware_equal(base, out, rows, (name, label))
