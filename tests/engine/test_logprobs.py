"""Logprobs: the target's raw log-softmax of every committed token and its top-n, the same in
speculative and baseline mode and equal to an uncached full forward; through `stream_generate`, one
TokenLogprob per visible token of each event."""


import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from engine.api import EngineInfo, Finished, GenerationRequest, SamplingParams, SpecConfig
from engine.processors import ProcessorSettings
from engine.runtime import Runtime
from engine.scheduler import Scheduler
from engine.text import apply_chat_template
from engine.generate import stream_generate
from tests.engine import tiny
from tests.engine.smollm2_cases import QUESTIONS
from tests.engine.test_smollm2_processors import VOCAB, decode

TOL = 1e-4
TOP = 5


def raw_logprobs(target, prompt, out) -> np.ndarray:
    """Reference [n, V]: float64 log-softmax of one uncached forward of prompt + out through the same
    target (its native kernels too, where it has them), row i scoring out[i]."""
    logits = np.array(target.logits(mx.array([prompt + out]))[0, len(prompt) - 1 : -1]).astype(np.float64)  # [n, V]
    top = logits.max(axis=-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))


def assert_top_close(a, b, label):
    """Two top-n lists [(id, lp)]: values within TOL; ids equal except inside a measured near-tie."""
    assert len(a) == len(b), label
    for j, ((ia, va), (ib, vb)) in enumerate(zip(a, b)):
        assert abs(va - vb) <= TOL, (label, j, va, vb)
        if ia != ib:  # only two alternatives within TOL may swap places
            assert abs(va - a[j + 1 if j + 1 < len(a) else j - 1][1]) <= TOL, (label, j, a, b)


def assert_logprobs_match(lps, ref, out, label):
    """Per-token (logprob, top) against a reference list of the same form."""
    for i, ((lp, top), (ref_lp, ref_top)) in enumerate(zip(lps, ref)):
        assert abs(lp - ref_lp) <= TOL, (label, i, lp, ref_lp)
        assert_top_close(top, ref_top, (label, i))


def as_reference(rows: np.ndarray, out) -> list:
    """The reference rows in the decoder's (logprob, [(id, logprob)] * TOP) form."""
    result = []
    for row, token in zip(rows, out):
        ids = np.argsort(-row)[:TOP]
        result.append((row[token], [(int(i), row[i]) for i in ids]))
    return result


def common_prefix(a, b) -> int:
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# The bias bans the greedy first token, so the chosen token is not the raw top-1 there: the reported
# values must still be the raw ones (before processors), like vLLM's and OpenAI's.
@pytest.mark.parametrize("procs", [ProcessorSettings(), ProcessorSettings(repetition_penalty=1.3,
                                                                          logit_bias=((504, -100.0),))],
                         ids=["plain", "processed"])
def test_speculative_logprobs_equal_baseline_and_reference(smollm2, procs):
    """Oracle (mixed accepts, recovered and bonus tokens) and random DSpark rounds report the
    baseline's logprobs, which equal log_softmax of one uncached forward."""
    target, tok, dspark, _ = smollm2
    prompt = apply_chat_template(tok, [{"role": "user", "content": QUESTIONS[3]}])
    base, _, base_lps = decode(target, prompt, 32, procs, logprobs=TOP)
    assert len(base_lps) == len(base) and all(len(top) == TOP for _, top in base_lps)
    ref = as_reference(raw_logprobs(target, prompt, base), base)
    assert_logprobs_match(base_lps, ref, base, "baseline vs uncached forward")
    if procs.active:
        assert base[0] != 504 and base_lps[0][1][0][0] == 504  # raw: the banned token still ranks first
    oracle = tiny.OracleDrafter(target, reference=prompt + base, corrupt_every=4, vocab=VOCAB)
    for label, drafter, n in (("oracle", oracle, 32), ("dspark", dspark, 10)):
        out, dec, lps = decode(target, prompt, n, procs, drafter, logprobs=TOP)
        assert len(lps) == len(out)
        k = common_prefix(base, out)  # past a (near-tie) divergence the histories differ
        assert_logprobs_match(lps[:k], base_lps[:k], out, (label, "vs baseline"))
        if label == "oracle":
            assert k == len(out) and 0 < dec.stats.accepted_tokens < dec.stats.drafted_tokens


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return load_tokenizer(default_model_dir)


def tiny_runtime(tokenizer, target, mode):
    """A Runtime over the tiny target (vocab 256) with the SmolLM2 tokenizer, cap 2."""
    drafter = tiny.dspark_drafter() if mode == "dspark" else None
    info = EngineInfo(model_id="tiny", model_path="-", mode=mode, drafter="random" if drafter else None,
                      cap=2 if drafter else None, context_length=64, sampler="rejection")
    runtime = Runtime(target, drafter, tokenizer, info, frozenset(), SpecConfig(mode=mode, max_draft=2))
    runtime.make_scheduler = lambda: Scheduler(2) if drafter else None
    return runtime


def generate(runtime, max_tokens=12, temperature=0.0, seed=0, logprobs=3, stop_ids=()):
    """(events, finished) of one request through the engine's request loop on this thread."""
    sampling = SamplingParams(temperature=temperature, seed=seed)
    request = GenerationRequest("r", (5, 6, 7), max_tokens, sampling, stop_token_ids=stop_ids, logprobs=logprobs)
    *events, finished = stream_generate(runtime, request)
    assert isinstance(finished, Finished)
    return events, finished


def test_request_loop_one_logprob_per_visible_token(tokenizer):
    """Each TokenEvent carries one TokenLogprob per visible token (the ending stop id has none),
    with the token's own text and the top alternatives most likely first."""
    target = tiny.tiny_target(seed=0, scale=4.0)
    runtime = tiny_runtime(tokenizer, target, "dspark")
    events, _ = generate(runtime)
    ids = [t for e in events for t in e.token_ids]
    stop = next(t for i, t in enumerate(ids) if i >= 3 and t not in ids[:i])  # first seen late enough
    events, finished = generate(runtime, stop_ids=(stop,))
    assert finished.reason == "stop" and events[-1].token_ids[-1] == stop
    for e in events:
        visible = e.token_ids[:-1] if e is events[-1] else e.token_ids
        assert [x.token_id for x in e.logprobs] == visible
        for x in e.logprobs:
            assert x.token == tokenizer.decode([x.token_id], skip_special_tokens=False)
            assert len(x.top) == 3 and [v for _, _, v in x.top] == sorted((v for _, _, v in x.top), reverse=True)
            assert all(text == tokenizer.decode([i], skip_special_tokens=False) for i, text, _ in x.top)
    assert sum(len(e.logprobs) for e in events) == finished.usage.completion_tokens - 1
    assert all(e.logprobs is None for e in generate(runtime, logprobs=None)[0])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_request_loop_logprobs_are_the_targets(tokenizer, temperature):
    """Speculative (random drafter: rejections, recovered tokens) and baseline runs report the raw
    target log p of each token and its top-3, as one uncached forward gives them."""
    target = tiny.tiny_target(seed=0, scale=4.0)
    for mode in ("dspark", "baseline"):
        events, _ = generate(tiny_runtime(tokenizer, target, mode), max_tokens=16, temperature=temperature, seed=3)
        ids = [t for e in events for t in e.token_ids]
        rows = raw_logprobs(target, [5, 6, 7], ids)  # [n, V]
        got = [x for e in events for x in e.logprobs]
        for i, x in enumerate(got):
            assert abs(x.logprob - rows[i, ids[i]]) <= TOL, (mode, i)
            assert_top_close([(t, v) for t, _, v in x.top], [(int(t), rows[i, t]) for t in np.argsort(-rows[i])[:3]],
                             (mode, i))
