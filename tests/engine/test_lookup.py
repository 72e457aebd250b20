"""Prompt lookup (engine/lookup.py): the incremental n-gram index against a brute-force rescan, and
lookup as a drafter kind of SpecDecoder on the tiny model (greedy and seed-stable identity, plain
steps without a match, no taps, invariants, statistics by kind)."""

import random

import mlx.core as mx
import pytest

from engine.api import SpecConfig, SpecStats
from engine.lookup import LookupConfig, LookupDrafter, NgramIndex, copy_from
from engine.runtime import lookup_config
from engine.sampling import SamplerSettings, point_mass_logprobs, rejection_accept, residual_probs
from engine.samplers import make_sampler
from engine.scheduler import PROBE_EVERY, CostCurve, LookupScheduler, Scheduler
from engine.seams import drafter_kind
from engine.spec import DecodeOptions, SpecDecoder
from tests.engine import tiny

GREEDY = SamplerSettings(temperature=0.0)
TIE_EPS = 1e-4  # as tests/engine/test_spec.py (docs/method.md §7.1)
# Prompts whose greedy continuations on the tiny target copy them often (a period of 5 or 3).
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2], [7, 8, 9, 7, 8, 9, 7], [11, 40, 3, 11, 40, 3, 99, 11, 40]]
# The verify curve of the study in docs/lookup.md (500 tokens of context), with no draft cost.
LOOKUP_CURVE = CostCurve(verify_s=[1.0, 1.28, 1.37, 1.54, 1.63, 1.69, 1.86, 1.93, 2.02], draft_fixed_s=0.0,
                         draft_per_token_s=0.0)


# ---------------------------------------------------------------- the index


def brute_force(seq: list[int], limit: int, min_n: int = 2, max_n: int = 3) -> list[int]:
    """The specification, by rescanning: for n = max_n..min_n, the latest earlier occurrence of the
    last n tokens that has a token after it; copy from there (past the end: the copy itself)."""
    if limit <= 0:
        return []
    for n in range(max_n, min_n - 1, -1):
        if len(seq) < n:
            continue
        suffix = seq[-n:]
        for start in range(len(seq) - 1, n - 1, -1):  # start = where the continuation begins
            if seq[start - n : start] == suffix:
                return copy_from(seq, start, limit)
    return []


@pytest.mark.parametrize("vocab,min_n", [(3, 2), (5, 2), (8, 3), (4, 1)])
def test_incremental_index_equals_a_rescan(vocab, min_n):
    """On random streams fed in random chunks, every proposal equals the brute-force rescan's."""
    rng = random.Random(vocab * 10 + min_n)
    for _ in range(20):
        index, seq = NgramIndex(min_n, 3), []
        while len(seq) < 60:
            chunk = [rng.randrange(vocab) for _ in range(rng.randint(1, 4))]
            index.extend(chunk)
            seq += chunk
            limit = rng.randint(0, 9)
            assert index.propose(limit) == brute_force(seq, limit, min_n), (seq, limit)
        assert index.tokens == seq and len(index) == len(seq)


def test_longest_match_first_then_shorter():
    """A 3-token match wins over a later 2-token one; without a 3-token match a 2-token one drafts."""
    index = NgramIndex(2, 3)
    index.extend([1, 2, 3, 50, 9, 2, 3, 60, 1, 2, 3])  # (1, 2, 3) -> 50; the later (2, 3) -> 60
    assert index.propose(2) == [50, 9]
    index = NgramIndex(2, 3)
    index.extend([1, 2, 3, 50, 9, 2, 3, 60, 8, 2, 3])  # (8, 2, 3) never occurred before: 2 tokens
    assert index.propose(2) == [60, 8]


def test_latest_occurrence_wins():
    """Of several earlier occurrences, the most recent one is copied."""
    index = NgramIndex(2, 3)
    index.extend([5, 6, 10, 11, 5, 6, 20, 21, 5, 6])
    assert index.propose(2) == [20, 21]


def test_minimum_match_length_and_no_match():
    """No earlier occurrence of a long-enough suffix: an empty proposal. min_ngram=3 ignores 2-token matches."""
    index = NgramIndex(2, 3)
    index.extend([1, 2, 3, 4])
    assert index.propose(8) == []
    index.extend([2, 3])
    assert index.propose(8)[:3] == [4, 2, 3]
    strict = NgramIndex(3, 3)
    strict.extend([1, 2, 3, 4, 2, 3])
    assert strict.propose(8) == []
    assert NgramIndex(2, 3).propose(4) == []  # empty context


def test_limit_is_respected_and_the_copy_runs_on_past_the_end():
    """Exactly `limit` tokens once matched: past the context's end the copy repeats its own period."""
    index = NgramIndex(2, 3)
    index.extend([9, 1, 2, 3, 1, 2])  # (1, 2) -> 3, period 3: 3 1 2 3 1 2 ...
    for limit in range(0, 8):
        assert index.propose(limit) == [3, 1, 2, 3, 1, 2, 3][:limit]
    run = NgramIndex(2, 3)
    run.extend([4, 4, 4])  # (4, 4) -> the last 4: period 1
    assert run.propose(5) == [4] * 5


@pytest.mark.parametrize("vocab,min_n", [(3, 2), (6, 2), (4, 3), (2, 3)])
def test_may_match_next_is_false_only_when_no_next_token_can_match(vocab, min_n):
    """Whenever the index says no match is possible next, no next token gives one; and it says so
    at least sometimes (a check that is always True would pass the first half)."""
    rng = random.Random(vocab * 7 + min_n)
    said_no = 0
    for _ in range(30):
        index = NgramIndex(min_n, 3)
        while len(index) < 40:
            if not index.may_match_next():
                said_no += 1
                for y in range(vocab):
                    probe = index.copy()
                    probe.extend([y])
                    assert probe.propose(8) == [], (index.tokens, y)
            index.extend([rng.randrange(vocab)])
    assert said_no > 0


def test_copy_is_independent():
    """A copied index (fork) moves on its own."""
    index = NgramIndex(2, 3)
    index.extend([1, 2, 3, 1, 2])
    other = index.copy()
    other.extend([7, 1, 2])
    assert index.propose(1) == [3] and other.propose(1) == [7] and len(index) == 5


def test_lookup_config_validates_and_follows_the_spec():
    """Sizes are checked; the runtime's config takes --lookup-min-ngram and a fixed --max-draft."""
    with pytest.raises(ValueError):
        LookupConfig(min_ngram=3, max_ngram=2)
    with pytest.raises(ValueError):
        LookupConfig(min_ngram=0)
    assert lookup_config(SpecConfig(mode="lookup")) == LookupConfig(min_ngram=2, max_ngram=3, max_drafts=8)
    assert lookup_config(SpecConfig(mode="lookup", max_draft=12, lookup_min_ngram=4)) == LookupConfig(4, 4, 12)


# ---------------------------------------------------------------- the accept rule with a point mass


def test_point_mass_rejection_is_exact():
    """One-hot log q: accepted with p(x), recovered from p without x; the exact output law is p and
    nothing is NaN, including p(x) = 0 and p(x) = 1."""
    for p in ([0.5, 0.3, 0.2, 0.0], [0.0, 0.6, 0.4, 0.0], [1.0, 0.0, 0.0, 0.0]):
        for x in range(4):
            probs = mx.array(p)
            logq = point_mass_logprobs([x], 4)  # [1, V]
            assert not mx.any(mx.isnan(logq)).item()
            residual = residual_probs(probs, mx.exp(logq[0]))  # [V]
            out = [p[x] * (v == x) + (1 - p[x]) * residual[v].item() for v in range(4)]
            assert out == pytest.approx(p, abs=1e-6), (p, x)
            logp = mx.log(mx.stack([probs, probs]))  # [2, V]: the row judging x, then the bonus row
            n, token = rejection_accept([x], logq, logp, mx.random.key(x))
            assert 0 <= token < 4 and p[token] > 0 and n in (0, 1)


# ---------------------------------------------------------------- lookup in the decoder


@pytest.fixture(scope="module")
def target():
    return tiny.tiny_target(seed=0, scale=4.0)


def decoder(target, drafter, settings=GREEDY, sampler="rejection", seed=0, scheduler=None):
    opts = DecodeOptions(make_sampler(settings, sampler, seed), stop_ids=frozenset())
    kind = drafter_kind(drafter) or "baseline"
    sched = scheduler or (Scheduler(drafter.config.max_drafts) if drafter is not None else None)
    return SpecDecoder(target, drafter, sched, opts, SpecStats(mode=kind, cap=4))


def run(dec, prompt, n):
    out = dec.prefill(prompt)
    while len(out) < n and not dec.done:
        out += dec.step(n - len(out))
        dec.check_invariants()
    return out


def top2_gap(target, ids):
    top = mx.sort(target.model(mx.array([ids]))[0, -1])[-2:].tolist()
    return top[1] - top[0]


@pytest.mark.parametrize("cap", [1, 4, 8])
def test_greedy_lookup_equals_plain_greedy(target, cap):
    """Greedy lookup decoding emits the plain greedy ids (a divergence only at a measured tie), and drafts."""
    for prompt in PROMPTS:
        plain = run(decoder(target, None), prompt, 40)
        dec = decoder(target, LookupDrafter(LookupConfig(max_drafts=cap)))
        spec = run(dec, prompt, 40)
        i = next((j for j, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
        if i is not None:
            assert top2_gap(target, prompt + plain[:i]) <= TIE_EPS, (prompt, i)
        assert len(spec) == len(plain)
    assert dec.stats.by_kind["lookup"].drafted_tokens > 0


@pytest.mark.parametrize("settings", [SamplerSettings(temperature=1.0), SamplerSettings(temperature=0.7, top_k=5)])
def test_seed_stable_lookup_equals_plain_seed_stable(target, settings):
    """seed-stable: a seed gives the plain seed-stable tokens whatever lookup drafts."""
    drafted = 0
    for seed in range(3):
        for prompt in PROMPTS:
            plain = run(decoder(target, None, settings, "seed-stable", seed), prompt, 30)
            dec = decoder(target, LookupDrafter(), settings, "seed-stable", seed)
            assert run(dec, prompt, 30) == plain, (seed, prompt)
            drafted += dec.stats.drafted_tokens
    assert drafted > 0


class CountingTarget:
    """The target, counting forwards by width and recording every taps value returned."""

    def __init__(self, target):
        self._target, self.widths, self.taps = target, [], []

    def __getattr__(self, name):
        return getattr(self._target, name)

    def forward(self, ids, cache, taps=True, inputs=None):
        logits, tapped = self._target.forward(ids, cache, taps=taps)
        self.widths.append(ids.shape[1])
        self.taps.append(tapped)
        return logits, tapped


def test_no_match_round_is_a_plain_step_and_no_taps_are_built(target):
    """With no match the round runs the anchor alone (a plain step), never a verify; lookup asks the
    (tapped) target for no taps and keeps no draft context."""
    counting = CountingTarget(target)
    dec = decoder(counting, LookupDrafter())
    dec.prefill([10, 20, 30, 40, 50, 60])  # no repeated pair: nothing to copy yet
    widths_before = len(counting.widths)
    verify_calls = []
    dec._verify = lambda ids: verify_calls.append(ids)  # must not be reached without a match
    new = dec.step(8)
    # 60 never occurred before, so no next token can match: the next step's forward is queued too.
    assert len(new) == 1 and verify_calls == [] and counting.widths[widths_before:] == [1, 1]
    assert dec.stats.by_kind["lookup"].empty_rounds == 1 and dec.stats.drafted_tokens == 0
    assert all(t is None for t in counting.taps) and dec.ctx_pending is None
    dec.check_invariants()
    dec.step(8)  # the queued step: counted as a round without a match
    assert dec.stats.by_kind["lookup"].empty_rounds == 2 and dec.stats.rounds == 2
    dec.check_invariants()


def test_no_match_step_waits_when_the_next_token_could_match(target):
    """A plain step does not queue the next forward when some next token would give a match: after
    a prompt holding every id once, the last id is never followed (no match now), but whatever comes
    next follows an id that was (a match is possible)."""
    counting = CountingTarget(target)
    dec = decoder(counting, LookupDrafter())
    dec.prefill(list(range(target.vocab_size)))
    widths_before = len(counting.widths)
    assert dec._index.propose(8) == [] and dec._index.may_match_next()
    dec.step(8)
    assert counting.widths[widths_before:] == [1] and dec._ahead is None
    assert dec.stats.by_kind["lookup"].empty_rounds == 1
    dec.check_invariants()


def test_a_match_verifies_the_drafts_and_counts_by_kind(target):
    """With a match the round verifies anchor + drafts in one forward, and the counters go to 'lookup'."""
    counting = CountingTarget(target)
    dec = decoder(counting, LookupDrafter(LookupConfig(max_drafts=4)))
    prompt = PROMPTS[0]
    run(dec, prompt, 30)
    kind = dec.stats.by_kind["lookup"]
    assert kind.rounds > 0 and kind.drafted_tokens == dec.stats.drafted_tokens
    assert kind.accepted_tokens == dec.stats.accepted_tokens
    assert kind.rounds + kind.empty_rounds == dec.stats.rounds
    assert max(counting.widths[1:]) == 5  # anchor + a full cap of 4 drafts in one forward
    assert all(t is None for t in counting.taps)
    assert dec.stats.as_dict()["by_kind"]["lookup"]["drafted_tokens"] == kind.drafted_tokens


def test_fork_copies_the_index(target):
    """Forks share the prompt's forward pass and each gets its own copy of the index."""
    settings = SamplerSettings(temperature=1.0)
    template = decoder(target, LookupDrafter(), settings, seed=0)
    template.read_prompt(PROMPTS[0])
    forks = [template.fork(DecodeOptions(make_sampler(settings, "rejection", s), frozenset()),
                           Scheduler(8), SpecStats(mode="lookup", cap=8)) for s in range(3)]
    for f in forks:
        out = f.first_token()
        while len(out) < 12:
            out += f.step(12 - len(out))
            f.check_invariants()
    assert template._index.tokens == PROMPTS[0]


def test_lookup_scheduler_adapts_the_cap(target):
    """On a zero-draft-cost curve the cap follows lookup's recent rounds: a copy run raises it to the
    largest cap, misses bring it down and then to plain steps (with a probe every PROBE_EVERY)."""
    s = LookupScheduler(8, LOOKUP_CURVE)
    start = s.expected_cap
    for _ in range(6):
        s.observe(s.expected_cap, s.expected_cap)  # every draft accepted
    high = s.expected_cap
    for _ in range(4):
        s.observe(s.expected_cap, 0)  # the copy run ended: the first draft is rejected
    lower = s.expected_cap
    for _ in range(8):
        s.observe(max(s.expected_cap, 1), 0)
    assert 0 < start < high == 8 and lower < high and s.expected_cap == 0 and s.rate < 0.2
    wants = [s.wants_draft() for _ in range(PROBE_EVERY)]
    assert wants == [False] * (PROBE_EVERY - 1) + [True]
    s.observe(0, 0)  # a round without a match teaches nothing
    assert s.expected_cap == 0


def test_lookup_scheduler_is_lossless_and_drafts(target):
    """Greedy decoding under the adaptive lookup cap equals plain greedy decoding, with drafts."""
    dec = decoder(target, LookupDrafter(), scheduler=LookupScheduler(8, LOOKUP_CURVE))
    assert run(dec, PROMPTS[0], 40) == run(decoder(target, None), PROMPTS[0], 40)
    assert dec.stats.drafted_tokens > 0
