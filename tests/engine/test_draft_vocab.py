"""A drafter with a draft vocabulary (shortlist.json, docs/method.md §3.6), as served.

Rows: without a shortlist serving's rows are `draft_logits`' exactly; with one they equal the full
logits on the shortlist and are -inf elsewhere, for every layout. Greedy: output equals plain
greedy decoding, also when the shortlist lacks tokens the target picks. T=1: the exact joint of
test_lossless.py, and a negative control (the accept rule given the drafter's whole-vocabulary q
while drafts come from the shortlist). A grammar that forbids every shortlisted token of a row stops
the draft there. Loading: the file is read, absent means None, a malformed one is refused by name.
The cost timer drafts through the same rows.
"""

import json

import mlx.core as mx
import numpy as np
import pytest

from engine import costs, sampling
from engine.api import SpecStats
from engine.loading.drafter import SHORTLIST_FILE, DrafterLoadError, load_drafter, save_drafter
from engine.models import drafter as drafter_module
from engine.models.drafter import draft_base, draft_logits, draft_rows, quantize_drafter
from engine.samplers import RejectionSampler, make_sampler
from engine.scheduler import Scheduler
from engine.spec import DecodeOptions, SpecDecoder
from tests.engine import joint, test_lossless_grammar as gr, tiny
from tests.engine.test_lossless import BUDGET, L, N, PROMPT, TARGET, V
from tests.engine.test_spec import GREEDY, PROMPTS, make_decoder, run
from tests.stats import assert_detected, assert_fits

HALF = mx.arange(0, tiny.VOCAB, 2, dtype=mx.int32)  # even ids: half the tiny vocabulary
SHORT = mx.array([0, 1, 4, 5], dtype=mx.int32)  # 4 of the 6 tokens of the exact-distribution tests
T1 = sampling.SamplerSettings(temperature=1.0)
# The control below misses by far: p = 5e-16 at 500 draws (2026-12-07; 3e-9 at 300), so it draws
# 500, half the suite's usual 1000, keeping both statistical tests near 30 s of one core.
N_CONTROL = 500


def layouts(target):
    """The three drafter families that share the serving path: DeepSpec, Gemma-4 (soft cap), z-lab."""
    return {"dspark": tiny.dspark_drafter(), "gemma": tiny.gemma_drafter(), "dflash": tiny.dflash_drafter(target)}


@pytest.fixture(scope="module")
def target():
    return tiny.tiny_target(seed=0, scale=4.0)


# ---------------------------------------------------------------- rows


def test_rows_without_a_shortlist_are_draft_logits_exactly(target):
    """No shortlist (every published drafter): base and rows are bit-identical to `draft_logits`."""
    h = mx.random.normal((3, tiny.HIDDEN), key=mx.random.key(1))  # [3, d]
    for name, drafter in layouts(target).items():
        assert drafter.shortlist is None
        base = draft_base(drafter, h)  # [3, V]
        assert mx.array_equal(base, drafter.base_logits(h)), name
        assert mx.array_equal(draft_rows(drafter, h[:1], mx.array([4]), base[:1]),
                              draft_logits(drafter, h[:1], mx.array([4]), base[:1])), name


def test_rows_over_a_shortlist_equal_the_full_logits_there_and_are_minus_inf_elsewhere(target):
    """With a shortlist the row holds the full row's values on S (soft cap and Markov bias included),
    -inf off S, through the base path and the lazy path alike, and again once the rows are cached."""
    h = mx.random.normal((3, tiny.HIDDEN), key=mx.random.key(2))
    on = np.zeros(tiny.VOCAB, dtype=bool)
    on[np.array(HALF)] = True
    for name, drafter in layouts(target).items():
        full = np.array(draft_logits(drafter, h[1:2], mx.array([7])))[0]  # [V]
        drafter.set_shortlist(HALF)
        base = draft_base(drafter, h)  # [3, S]
        assert base.shape == (3, HALF.shape[0]), name
        for _ in range(2):  # the second pass reads the cached head and Markov rows
            for row in (draft_rows(drafter, h[1:2], mx.array([7]), base[1:2]), draft_rows(drafter, h[1:2], mx.array([7]))):
                row = np.array(row)[0]
                np.testing.assert_allclose(row[on], full[on], rtol=1e-5, atol=1e-5, err_msg=name)
                assert np.isneginf(row[~on]).all(), name
        drafter.set_shortlist(None)
        assert mx.array_equal(draft_rows(drafter, h[1:2], mx.array([7])), draft_logits(drafter, h[1:2], mx.array([7])))


@pytest.mark.parametrize("mode", ["8bit", "4bit"])
def test_quantized_heads_read_their_shortlist_rows_dequantized(target, mode):
    """A quantized drafter: the head's rows for the shortlist are dequantized once and give the
    quantized product's values on S."""
    drafter = quantize_drafter(tiny.dspark_drafter(), mode)
    h = mx.random.normal((2, tiny.HIDDEN), key=mx.random.key(3))
    full = np.array(draft_logits(drafter, h[:1], mx.array([7])))[0]  # [V]
    drafter.set_shortlist(HALF)
    row = np.array(draft_rows(drafter, h[:1], mx.array([7])))[0]
    assert drafter._shortlist_rows[1] is not None
    np.testing.assert_allclose(row[np.array(HALF)], full[np.array(HALF)], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- greedy


def test_greedy_with_a_shortlist_equals_plain_greedy(target):
    """Greedy output equals plain greedy decoding with a shortlist that holds only some of the tokens
    the target picks (the target's correction supplies the others) and with one that holds none."""
    for prompt in PROMPTS[:2]:
        plain = run(make_decoder(target, None, None), prompt, 20)
        picked = sorted(set(plain))
        some = sorted((set(np.array(HALF).tolist()) | set(picked[::2])) - set(picked[1::2]))
        none = [t for t in range(tiny.VOCAB) if t not in picked]
        for ids in (some, none):
            drafter = tiny.dspark_drafter().set_shortlist(mx.array(ids, dtype=mx.int32))
            assert run(make_decoder(target, drafter, 4), prompt, 20) == plain


def test_oracle_with_a_shortlist_is_accepted_only_inside_it(target):
    """A shortlist that excludes some of the target's greedy tokens: those drafts are never made, yet
    the output is plain greedy's and the tokens inside are still accepted."""
    plain = run(make_decoder(target, None, None), PROMPTS[0], 20)
    drafter = tiny.dspark_drafter()
    excluded = sorted(set(plain))[:2]
    drafter.set_shortlist(mx.array([t for t in range(tiny.VOCAB) if t not in excluded], dtype=mx.int32))
    drafted: list[int] = []
    dec = make_decoder(target, drafter, 4)
    original = dec.draft

    def spy(limit):
        ids, logq = original(limit)
        drafted.extend(ids)
        return ids, logq

    dec.draft = spy
    assert run(dec, PROMPTS[0], 20) == plain
    assert drafted and not set(drafted) & set(excluded)


# ---------------------------------------------------------------- the exact distribution at T = 1


def short_drafter():
    """The exact-distribution tests' drafter with the 4-token shortlist SHORT."""
    return tiny.lossless_drafter().set_shortlist(SHORT)


def sample_joint(drafter, n, sampler_cls=None):
    make = sampler_cls or (lambda s, seed: make_sampler(s, "rejection", seed))

    def args(seed):
        return DecodeOptions(make(T1, seed), frozenset()), Scheduler(4), SpecStats(mode="dspark", cap=4)

    opts, scheduler, stats = args(0)
    template = SpecDecoder(TARGET, drafter, scheduler, opts, stats)
    template.read_prompt(PROMPT)
    return joint.sample_cells(template, args, n, BUDGET, V, L)


@pytest.fixture(scope="module")
def exact():
    return joint.exact_joint(TARGET, PROMPT, T1, V, L)


def test_joint_distribution_with_a_shortlist(exact):
    """T=1, rejection sampling, drafts from a 4-of-6 shortlist: the output fits the exact joint."""
    assert_fits(sample_joint(short_drafter(), N), exact)


class FullQSpy:
    """The drafter, also recording the whole-vocabulary logits of the draft row formed last."""

    def __init__(self, drafter):
        self._drafter, self.full_row = drafter, None

    def __getattr__(self, name):
        return getattr(self._drafter, name)

    def markov_bias(self, prev_ids, h=None, vocab=None):
        d = self._drafter
        self.full_row = (d.base_logits(h) + d.markov_bias(prev_ids, h))[0]  # [V]
        return d.markov_bias(prev_ids, h, vocab)


def test_control_accept_rule_given_the_whole_vocabulary_q(exact):
    """Negative control: drafts drawn from the shortlist's softmax, but the ratio and residual use the
    drafter's softmax over all V tokens (not the q the drafts came from): detected."""
    spy = FullQSpy(short_drafter())

    class WholeVocabularyQ(RejectionSampler):
        def draft_token(self, logits, position):
            token, _ = super().draft_token(logits, position)
            return token, sampling.process_logits(spy.full_row, self.settings)

    assert_detected(sample_joint(spy, N_CONTROL, sampler_cls=WholeVocabularyQ), exact)


# ---------------------------------------------------------------- a grammar that forbids the whole shortlist


PAIRS = gr.compiled("(b[ad])*")  # b at even positions, then a or d


def pairs_allowed(generated: list[int]) -> list[int]:
    """What PAIRS allows after `generated` (EOS aside)."""
    return [1] if len(generated) % 2 == 0 else [0, 3]


@pytest.mark.parametrize("settings,sampler", [(GREEDY, "rejection"), (T1, "rejection"), (T1, "seed-stable")])
def test_a_row_with_every_shortlisted_token_forbidden_stops_the_draft(settings, sampler):
    """A shortlist of a, d, e, f (0, 3-5) under a grammar that allows only b (1) at even positions:
    such a draft row is -inf everywhere. The round stops drafting there (a round anchored before an
    odd position still drafts one token), instead of drawing a forbidden token from it (the argmax
    of an all -inf row, or a NaN q), which the grammar then refuses. The output stays valid; greedy
    equals plain constrained greedy."""
    drafter = tiny.lossless_drafter().set_shortlist(mx.array([0, 3, 4, 5], dtype=mx.int32))
    opts = DecodeOptions(make_sampler(settings, sampler, 3), frozenset(), grammar=PAIRS)
    dec = SpecDecoder(TARGET, drafter, Scheduler(4), opts, SpecStats(mode="dspark", cap=4))
    out = dec.prefill(PROMPT)
    while len(out) < 12:
        out += dec.step(BUDGET)
        dec.check_invariants()
    assert all(out[k] in pairs_allowed(out[:k]) for k in range(12))
    assert dec.stats.drafted_tokens > 0
    if settings.greedy:
        reference: list[int] = []
        for _ in range(12):
            row = np.array(TARGET.model(mx.array([PROMPT + reference]))[0, -1])  # [V]
            allowed = pairs_allowed(reference)
            reference.append(allowed[int(np.argmax(row[allowed]))])
        assert out[:12] == reference


# ---------------------------------------------------------------- loading


@pytest.fixture
def saved(tmp_path):
    """A tiny DeepSpec drafter saved without a shortlist file: its directory."""
    drafter = tiny.dspark_drafter()
    return save_drafter(drafter, drafter.config, tmp_path / "d")


def _load(path):
    return load_drafter(str(path), target_vocab_size=tiny.VOCAB, target_num_layers=tiny.TARGET_LAYERS)[0]


def test_the_shortlist_file_loads_and_its_absence_means_none(saved):
    """No file: no shortlist (rows over the whole vocabulary). A file: its ids, as int32, rows
    restricted to them; saving a drafter that has one writes it back."""
    assert _load(saved).shortlist is None
    (saved / SHORTLIST_FILE).write_text(json.dumps({"size": 3, "label_coverage": 0.5, "ids": [1, 5, 9]}))
    drafter = _load(saved)
    assert drafter.shortlist.dtype == mx.int32 and drafter.shortlist.tolist() == [1, 5, 9]
    again = save_drafter(drafter, drafter.config, saved.parent / "again")
    assert json.loads((again / SHORTLIST_FILE).read_text())["ids"] == [1, 5, 9]


@pytest.mark.parametrize("raw,problem", [
    ({"ids": []}, "empty"),
    ({"ids": [3, 1, 2]}, "sorted"),
    ({"ids": [1, 1, 2]}, "duplicates"),
    ({"ids": [1, tiny.VOCAB]}, "must be in"),
    ({"ids": [-1, 2]}, "must be in"),
    ({"ids": [1, 2], "size": 3}, "'size'"),
    ({"ids": ["a"]}, "integer"),
    ({"size": 2}, "integer"),
])
def test_a_malformed_shortlist_file_is_refused_naming_it(saved, raw, problem):
    """Empty, unsorted, repeated or out-of-range ids (or a wrong size) are refused with the file's path."""
    (saved / SHORTLIST_FILE).write_text(json.dumps(raw))
    with pytest.raises(DrafterLoadError, match=problem) as info:
        _load(saved)
    assert str(saved / SHORTLIST_FILE) in str(info.value)


def test_an_unreadable_shortlist_file_is_refused_naming_it(saved):
    (saved / SHORTLIST_FILE).write_text("{not json")
    with pytest.raises(DrafterLoadError, match="cannot read .*shortlist.json"):
        _load(saved)


# ---------------------------------------------------------------- costs


def test_the_cost_timer_drafts_through_the_served_rows(monkeypatch):
    """`_draft_timer` forms rows with `draft_base` / `draft_rows` (the shortlist path when there is one),
    and the cost cache's key tells a shortlist drafter from the same shapes without one."""
    calls = []
    monkeypatch.setattr(costs, "draft_rows", lambda *a: calls.append(a) or drafter_module.draft_rows(*a))
    drafter = tiny.dspark_drafter().set_shortlist(HALF)
    costs._draft_timer(drafter)(3)
    assert len(calls) == 3 and calls[0][0] is drafter
    target = tiny.tiny_target()
    assert costs.curve_key(target, drafter, 4) != costs.curve_key(target, tiny.dspark_drafter(), 4)
