"""Exactness under a grammar (test_lossless.py's design, docs/method.md §5.8).

The tiny 6-token target of test_lossless.py, its poor random DSpark drafter, and prompt lookup
(whose drafts the grammar often forbids). Tokens are the bytes a..f, and a toy regular grammar
makes the allowed set depend on the previous token: pairs a[def], b[ad], c[bcf], repeated. The
exact law of plain constrained decoding comes from the chain rule over uncached target forwards,
each row masked by a hand-written reference of the grammar (not by llguidance). Speculative
generations must fit it at T=1 with rejection and seed-stable sampling, and match it exactly in
greedy. Negative control: verify rows masked with the state before the round's drafts.
"""

import itertools

import llguidance
import mlx.core as mx
import numpy as np
import pytest

from engine import grammar as grammar_module
from engine import sampling
from engine.api import GrammarSpec, SpecStats
from engine.grammar import CompiledGrammar, GrammarMatcher, compile_grammar
from engine.lookup import LookupConfig, LookupDrafter
from engine.samplers import RejectionSampler, make_sampler
from engine.scheduler import Scheduler
from engine.spec import DecodeOptions, SpecDecoder
from tests.engine import joint, tiny
from tests.engine.test_lossless import BUDGET, DRAFTER, L, N, N_CONTROL, PROMPT, TARGET, V
from tests.stats import assert_detected, assert_fits

EOS = V  # the grammar's end token: outside the model's vocabulary, so it is never drawn here
REGEX = "((a[def])|(b[ad])|(c[bcf]))*"
SECOND = {0: {3, 4, 5}, 1: {0, 3}, 2: {1, 2, 5}}  # the reference: a pair's second token given its first
T1 = sampling.SamplerSettings(temperature=1.0)
LOOKUP_TARGET = tiny.lossless_target(taps=False)


class ByteTokens:
    """A tokenizer for llguidance: token t is the byte 'a' + t, and EOS is special."""

    eos_token_id, bos_token_id, special_token_ids = EOS, None, [EOS]
    tokens = [bytes([ord("a") + t]) for t in range(V)] + [b"<eos>"]

    def __call__(self, text):
        data = text.encode() if isinstance(text, str) else text
        return [b - ord("a") for b in data]


def compiled(regex: str = REGEX) -> CompiledGrammar:
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteTokens()), n_vocab=V + 1)
    return CompiledGrammar(tokenizer, compile_grammar(GrammarSpec("regex", regex)), V)


GRAMMAR = compiled()


def reference_allowed(generated: tuple[int, ...]) -> list[int]:
    """The tokens the grammar allows after `generated` (EOS aside): a pair's first, or its second."""
    return [0, 1, 2] if len(generated) % 2 == 0 else sorted(SECOND[generated[-1]])


def masked_log_softmax(row: np.ndarray, allowed: list[int]) -> np.ndarray:
    x = np.full_like(row, -np.inf)
    x[allowed] = row[allowed]
    x = x - x[allowed].max()
    return x - np.log(np.exp(x[allowed]).sum())


def exact_joint(target=TARGET, prompt=PROMPT) -> np.ndarray:
    """P(first L generated tokens) [V**L] of plain constrained decoding at T=1, by the chain rule."""
    probs = np.zeros(V**L)
    for i, seq in enumerate(itertools.product(range(V), repeat=L)):
        if any(seq[k] not in reference_allowed(seq[:k]) for k in range(L)):
            continue  # the grammar forbids it: probability 0
        raw = np.array(target.model(mx.array([prompt + list(seq[:-1])]))[0, len(prompt) - 1 :])  # [L, V]
        probs[i] = np.exp(sum(masked_log_softmax(raw[k], reference_allowed(seq[:k]))[seq[k]] for k in range(L)))
    return probs / probs.sum()


def greedy_reference(length: int, target=TARGET, prompt=PROMPT) -> list[int]:
    """Plain constrained greedy decoding, uncached."""
    out: list[int] = []
    for _ in range(length):
        row = np.array(target.model(mx.array([prompt + out]))[0, -1])
        out.append(int(np.argmax(masked_log_softmax(row, reference_allowed(tuple(out))))))
    return out


def lookup_drafter() -> LookupDrafter:
    return LookupDrafter(LookupConfig(min_ngram=1, max_ngram=3, max_drafts=4))


def decoders(kind: str, sampler: str, settings=T1, sampler_cls=None):
    """(template after read_prompt, fork args) for the trained drafter or prompt lookup;
    `sampler_cls(settings, seed)` replaces the named sampler (negative controls)."""
    target, drafter = (TARGET, DRAFTER) if kind == "dspark" else (LOOKUP_TARGET, lookup_drafter())
    make = sampler_cls or (lambda s, seed: make_sampler(s, sampler, seed))

    def opts(seed):
        return DecodeOptions(make(settings, seed), frozenset(), grammar=GRAMMAR)

    def args(seed):
        return opts(seed), Scheduler(4), SpecStats(mode=kind, cap=4)

    opts0, scheduler, stats = args(0)
    template = SpecDecoder(target, drafter, scheduler, opts0, stats)
    # Lookup drafts from the context: a prompt holding every pair makes it propose often, and
    # often what the grammar forbids.
    template.read_prompt(PROMPT if kind == "dspark" else LOOKUP_PROMPT)
    return template, args


LOOKUP_PROMPT = [0, 3, 1, 1, 4, 2, 0, 5, 5, 3, 2, 1]


def sample_joint(kind: str, sampler: str, n: int, sampler_cls=None) -> np.ndarray:
    template, args = decoders(kind, sampler, sampler_cls=sampler_cls)
    return joint.sample_cells(template, args, n, BUDGET, V, L)


@pytest.fixture(scope="module")
def exact():
    return {"dspark": exact_joint(), "lookup": exact_joint(LOOKUP_TARGET, LOOKUP_PROMPT)}


def test_matcher_agrees_with_the_reference():
    """llguidance's masks (one state, and verify rows along drafts) are the reference's."""
    matcher = GRAMMAR.matcher()
    for seq in itertools.product(range(V), repeat=3):
        valid = next((k for k in range(3) if seq[k] not in reference_allowed(seq[:k])), 3)
        rows = np.array(matcher.allowed_rows(list(seq)))  # [4, V]
        for k in range(valid + 1):
            assert list(np.flatnonzero(rows[k])) == reference_allowed(seq[:k]), (seq, k)
        assert (rows[valid + 1 :] == rows[valid]).all()  # unreachable rows repeat the last reachable one
        if valid == 3:
            assert list(np.flatnonzero(np.array(matcher.allowed(seq)))) == reference_allowed(seq)
    matcher.commit([1, 0])
    assert list(np.flatnonzero(np.array(matcher.allowed()))) == [0, 1, 2]


@pytest.mark.parametrize("kind,sampler", [("dspark", "rejection"), ("dspark", "seed-stable"),
                                          ("lookup", "rejection")])
def test_joint_distribution_under_a_grammar(exact, kind, sampler):
    """T=1: speculative constrained output fits plain constrained decoding's exact joint."""
    cells = sample_joint(kind, sampler, N)
    assert_fits(cells, exact[kind])


@pytest.mark.parametrize("kind", ["dspark", "lookup"])
def test_greedy_equals_plain_constrained_greedy(kind):
    """Greedy: the first 12 tokens are plain constrained greedy decoding's, token for token."""
    template, args = decoders(kind, "rejection", sampling.SamplerSettings())
    dec = template.fork(*args(0))
    out = dec.first_token()
    while len(out) < 12:
        out += dec.step(BUDGET)
        dec.check_invariants()
    prompt = PROMPT if kind == "dspark" else LOOKUP_PROMPT
    assert out[:12] == greedy_reference(12, TARGET if kind == "dspark" else LOOKUP_TARGET, prompt)


def test_control_rows_masked_with_the_pre_draft_state(exact, monkeypatch):
    """Negative control: every verify row masked with the state before the drafts is detected.

    Such rows accept drafts the grammar forbids, which `GrammarMatcher.commit` refuses loudly; the
    control lets them through (as a matcher without that check would) to show the fit detects it."""
    def stale(self, drafts):
        return mx.broadcast_to(self.allowed(), (len(drafts) + 1, self.vocab))

    monkeypatch.setattr(GrammarMatcher, "allowed_rows", stale)
    with pytest.raises(RuntimeError, match="refused committed tokens"):
        sample_joint("dspark", "rejection", N_CONTROL)
    monkeypatch.setattr(GrammarMatcher, "commit", lambda self, tokens: self._matcher.try_consume_tokens(list(tokens)))
    assert_detected(sample_joint("dspark", "rejection", joint.DRAWS_FAR), exact["dspark"])


class RatioWithUnmaskedQ(RejectionSampler):
    """Draws each draft from the masked q but reports a q with mass on forbidden tokens too (as if
    the ratio p'/q used the drafter's unmasked distribution)."""

    def draft_token(self, logits, position):
        token, _ = super().draft_token(logits, position)
        finite = mx.where(mx.isinf(logits), logits[mx.argmax(logits)] + 1.0, logits)  # [V]
        return token, sampling.process_logits(finite, self.settings)


def test_control_ratio_with_unmasked_q(exact):
    """Negative control: a q in the accept ratio that is not the masked q the draft came from."""
    assert_detected(sample_joint("dspark", "rejection", joint.DRAWS_FAR, sampler_cls=RatioWithUnmaskedQ),
                    exact["dspark"])


def test_refused_grammar_names_the_problem():
    """A schema feature llguidance cannot serve is refused before decoding, naming it."""
    with pytest.raises(ValueError, match="uniqueItems") as info:
        compile_grammar(GrammarSpec("json_schema", '{"type": "array", "uniqueItems": true}', param="response_format"))
    assert info.value.param == "response_format"
    with pytest.raises(ValueError, match="look-around"):
        compile_grammar(GrammarSpec("regex", "a(?=b)"))
    assert grammar_module.compile_grammar.cache_info().currsize >= 1
