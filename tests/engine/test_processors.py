"""Logit processors (engine/processors.py) against a plain numpy reference of the four rules, the
per-row draft histories of a verify block, the zero-cost default, raw logprobs, and request checks."""

from collections import Counter

import mlx.core as mx
import numpy as np
import pytest

from engine import processors, sampling
from engine.api import EngineInfo, EngineInputError, GenerationRequest, SamplingParams
from engine.client import EngineClient
from engine.processors import LogitProcessor, ProcessorSettings

V = 40
SETTINGS = [
    ProcessorSettings(presence_penalty=0.7),
    ProcessorSettings(frequency_penalty=0.9),
    ProcessorSettings(repetition_penalty=1.6),
    ProcessorSettings(repetition_penalty=0.6),  # < 1 rewards repeats: the sign rule flips
    ProcessorSettings(logit_bias=((3, 5.0), (7, -250.0), (11, 0.5))),
    ProcessorSettings(presence_penalty=-0.4, frequency_penalty=1.2, repetition_penalty=1.3,
                      logit_bias=((0, 2.0), (5, -3.0))),
]


def reference(logits, prompt, generated, s: ProcessorSettings) -> np.ndarray:
    """The rules spelled out on one row [V]: bias, repetition (prompt + generated), presence/frequency
    (generated only), one token at a time."""
    x = np.array(logits, dtype=np.float64)
    for t, b in dict(s.logit_bias).items():
        x[t] += min(100.0, max(-100.0, b))
    r = s.repetition_penalty
    for t in set(prompt) | set(generated):
        x[t] = x[t] / r if x[t] > 0 else x[t] * r
    for t, c in Counter(generated).items():
        x[t] -= s.presence_penalty + s.frequency_penalty * c
    return x


def history(rng, n):
    # Small ids only, so repeats (count > 1) and prompt/generated overlaps are common.
    return [int(t) for t in rng.integers(0, 12, size=n)]


def make(s, prompt, generated, chunks=3) -> LogitProcessor:
    """A processor fed the prompt and then the generated tokens in a few commits."""
    proc = LogitProcessor(s, V)
    proc.add_prompt(prompt)
    for part in np.array_split(np.array(generated, dtype=np.int64), chunks):
        proc.commit([int(t) for t in part])
    return proc


@pytest.mark.parametrize("s", SETTINGS)
def test_single_row_matches_reference(s):
    """apply(): the committed history (prompt seen, generated counted), on random logits."""
    rng = np.random.default_rng(0)
    for _ in range(5):
        logits = rng.normal(0, 3, size=V).astype(np.float32)
        prompt, generated = history(rng, 6), history(rng, 9)
        got = np.array(make(s, prompt, generated).apply(mx.array(logits)))
        np.testing.assert_allclose(got, reference(logits, prompt, generated, s), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("s", SETTINGS)
def test_verify_rows_use_draft_prefixes(s):
    """apply_rows(): row k continues committed + drafts[:k] (drafts repeat each other and the history)."""
    rng = np.random.default_rng(1)
    for num_drafts in (0, 1, 5):
        logits = rng.normal(0, 3, size=(num_drafts + 1, V)).astype(np.float32)
        prompt, generated, drafts = history(rng, 5), history(rng, 7), history(rng, num_drafts)
        got = np.array(make(s, prompt, generated).apply_rows(mx.array(logits), drafts))
        want = np.stack([reference(logits[k], prompt, generated + drafts[:k], s) for k in range(num_drafts + 1)])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("s", SETTINGS)
def test_extra_tokens_and_lazy_pending(s):
    """apply(extra): drafts sampled so far (a list) or a queued step's lazy token (an array)."""
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 3, size=V).astype(np.float32)
    prompt, generated, extra = history(rng, 4), history(rng, 6), history(rng, 3)
    proc = make(s, prompt, generated)
    got = np.array(proc.apply(mx.array(logits), extra))
    np.testing.assert_allclose(got, reference(logits, prompt, generated + extra, s), rtol=1e-5, atol=1e-5)
    lazy = mx.argmax(mx.array(logits)).reshape(1) * 0 + extra[0]  # an unevaluated [1] token
    got = np.array(proc.apply(mx.array(logits), lazy))
    np.testing.assert_allclose(got, reference(logits, prompt, generated + extra[:1], s), rtol=1e-5, atol=1e-5)


def test_committing_in_one_go_or_in_pieces_agrees():
    """The history depends on the committed tokens only, not on how the rounds split them."""
    s, rng = SETTINGS[-1], np.random.default_rng(3)
    logits = mx.array(rng.normal(0, 3, size=V).astype(np.float32))
    prompt, generated = history(rng, 5), history(rng, 12)
    a, b = make(s, prompt, generated, chunks=1), make(s, prompt, generated, chunks=6)
    assert np.array_equal(np.array(a.apply(logits)), np.array(b.apply(logits)))


def test_draft_history_rows():
    """draft_history: a zero row, then cumulative one-hot counts."""
    got = np.array(processors.draft_history(mx.array([2, 0, 2]), 4))
    assert got.tolist() == [[0, 0, 0, 0], [0, 0, 1, 0], [1, 0, 1, 0], [1, 0, 2, 0]]


def test_defaults_are_a_no_op():
    """All defaults: no arrays, the very same logits back, nothing done on commit."""
    proc = LogitProcessor(ProcessorSettings(), 0)  # the decoder passes vocab 0 when inactive
    assert not proc.active and proc.counts is None and proc.seen is None and proc.bias is None
    logits = mx.array(np.random.default_rng(4).normal(size=(3, V)).astype(np.float32))
    proc.add_prompt([1, 2, 3])
    proc.commit([4, 5])
    assert proc.apply(logits, [1]) is logits and proc.apply_rows(logits, [1, 2]) is logits
    assert proc.counts is None
    assert not ProcessorSettings(logit_bias=((3, 0.0),)).active  # a zero bias changes nothing


def test_bias_only_keeps_no_history():
    """A logit bias alone needs no history: commits leave the counts untouched."""
    proc = LogitProcessor(ProcessorSettings(logit_bias=((1, 1.0),)), V)
    proc.commit([1, 1, 2])
    assert float(proc.counts.sum()) == 0.0


def test_each_processor_moves_the_argmax():
    """Each rule really changes the decision (so the equivalence tests can fail)."""
    logits = mx.array([0.0, 3.0, 2.5, 1.0] + [-1.0] * (V - 4))  # argmax 1
    cases = [
        (ProcessorSettings(logit_bias=((3, 5.0),)), [], 3),
        (ProcessorSettings(logit_bias=((1, -100.0),)), [], 2),
        (ProcessorSettings(repetition_penalty=1.5), [], 2),  # 1 is in the prompt: 3 / 1.5 < 2.5
        (ProcessorSettings(presence_penalty=1.0), [1], 2),
        (ProcessorSettings(frequency_penalty=0.3), [1, 1], 2),  # 3 - 0.6 < 2.5
    ]
    for s, generated, want in cases:
        proc = make(s, [1], generated, chunks=1)
        assert mx.argmax(proc.apply(logits)).item() == want, s
    assert mx.argmax(make(ProcessorSettings(presence_penalty=1.0), [1], [], chunks=1).apply(logits)).item() == 1


def test_bias_is_clamped_last_entry_wins_and_ids_are_checked():
    """OpenAI's range: a bias beyond +-100 acts as +-100; a repeated id keeps its last value."""
    bias = np.array(processors.dense_bias(((2, 1e6), (4, -1e6), (6, 1.0), (6, 2.0)), 8))
    assert bias.tolist() == [0, 0, 100, 0, -100, 0, 2, 0]
    assert processors.dense_bias(((1, 0.0),), 8) is None
    with pytest.raises(ValueError):
        processors.dense_bias(((8, 1.0),), 8)
    with pytest.raises(ValueError):
        ProcessorSettings(repetition_penalty=0.0)


def test_token_logprobs_match_numpy():
    """Raw log-softmax at the chosen ids, top-n sorted most likely first; n = 0 gives no alternatives."""
    rng = np.random.default_rng(5)
    rows = rng.normal(0, 2, size=(3, V)).astype(np.float32)
    tokens = [4, 0, 17]
    ref = rows - np.log(np.exp(rows.astype(np.float64)).sum(-1, keepdims=True))  # [3, V]
    got = sampling.token_logprobs(mx.array(rows), tokens, 5)
    for i, (lp, top) in enumerate(got):
        assert abs(lp - ref[i, tokens[i]]) < 1e-5
        want = np.argsort(-ref[i])[:5]
        assert [t for t, _ in top] == want.tolist()
        np.testing.assert_allclose([v for _, v in top], ref[i, want], atol=1e-5)
    assert all(top == [] for _, top in sampling.token_logprobs(mx.array(rows), tokens, 0))


def test_token_logprobs_are_float64_accurate_on_a_large_vocabulary():
    """Within 1e-5 of float64 on 49k logits; one float32 logsumexp pass is 5e-5 to 7e-5 off on these
    (and up to 2e-4 on SmolLM2's real rows)."""
    rng = np.random.default_rng(6)
    rows = rng.normal(0, 4, size=(2, 49152 + 7)).astype(np.float32)  # + 7: a width that needs padding
    x = rows.astype(np.float64)
    ref = x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
    got = sampling.token_logprobs(mx.array(rows), [0, 1], 2)
    for i, (lp, top) in enumerate(got):
        assert abs(lp - ref[i, i]) < 1e-5
        assert all(abs(v - ref[i, t]) < 1e-5 for t, v in top)


def _client_with_vocab(vocab):
    client = EngineClient.__new__(EngineClient)  # only `_validate` is used: no worker thread
    info = EngineInfo(model_id="m", model_path="-", mode="baseline", drafter=None, cap=None, context_length=64,
                      sampler="rejection", vocab_size=vocab)
    client.info = lambda: info
    return client


@pytest.mark.parametrize("sampling_kw, logprobs, param", [
    ({"logit_bias": ((100, 1.0),)}, None, "logit_bias"),
    ({"logit_bias": ((-1, 1.0),)}, None, "logit_bias"),
    ({"repetition_penalty": 0.0}, None, "repetition_penalty"),
    ({}, 21, "logprobs"),
    ({}, -1, "logprobs"),
])
def test_client_rejects_bad_processing_requests(sampling_kw, logprobs, param):
    """Out-of-vocab bias ids, a non-positive repetition penalty and logprobs outside 0..20 are 400s."""
    request = GenerationRequest("r", (1, 2), 4, SamplingParams(**sampling_kw), logprobs=logprobs)
    with pytest.raises(EngineInputError) as err:
        _client_with_vocab(100)._validate(request)
    assert err.value.param == param


def test_client_accepts_valid_processing_requests():
    """In-range values pass; with an unknown vocabulary (0) bias ids are not checked."""
    ok = GenerationRequest("r", (1, 2), 4, SamplingParams(logit_bias=((99, -100.0),), repetition_penalty=1.2,
                                                          presence_penalty=2.0), logprobs=20)
    _client_with_vocab(100)._validate(ok)
    far = GenerationRequest("r", (1, 2), 4, SamplingParams(logit_bias=((10**6, 1.0),)), logprobs=0)
    _client_with_vocab(0)._validate(far)
