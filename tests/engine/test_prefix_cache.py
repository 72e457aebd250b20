"""The prefix cache (engine/prefix_cache.py) on the tiny target in every decoding mode: outputs with
and without it, the round invariants after a restore, cancellation, errors, eviction and matching."""

import numpy as np
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from engine import spec as spec_module
from engine.api import EngineCancelled, EngineInfo, Finished, GenerationRequest, SamplingParams, SpecConfig, SpecStats
from engine.generate import generate, stream_generate
from engine.lookup import HybridDrafter, LookupConfig, LookupDrafter
from engine.models.target import cache_length
from engine.prefix_cache import PrefixCache, capture, prefix_cache_for
from engine.runtime import Runtime, hybrid_scheduler
from engine.samplers import make_sampler
from engine.sampling import SamplerSettings
from engine.scheduler import CostCurve, Scheduler
from engine.spec import DecodeOptions, SpecDecoder
from tests.engine import tiny

CURVE = CostCurve(verify_s=[1.0, 1.05, 1.1, 1.15, 1.2], draft_fixed_s=0.05, draft_per_token_s=0.01)
MODES = ("baseline", "dspark", "dflash", "lookup", "hybrid")
BUDGET = 64 * 2**20
TARGET = tiny.tiny_target()


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return load_tokenizer(default_model_dir)


def drafter_for(mode: str):
    if mode == "dspark":
        return tiny.dspark_drafter()
    if mode == "dflash":
        return tiny.dflash_drafter(TARGET)
    if mode == "lookup":
        return LookupDrafter(LookupConfig(max_drafts=4))
    if mode == "hybrid":
        return HybridDrafter(tiny.dspark_drafter(), LookupDrafter(LookupConfig(max_drafts=4)))
    return None


def make_runtime(tokenizer, mode: str, cache_bytes: int = BUDGET, target=TARGET, drafter="same") -> Runtime:
    drafter = drafter_for(mode) if drafter == "same" else drafter
    info = EngineInfo(model_id="tiny", model_path="-", mode=mode, drafter=None, cap=3, context_length=4096,
                      sampler="rejection")
    rt = Runtime(target, drafter, tokenizer, info, frozenset(), SpecConfig(mode=mode, max_draft=3),
                 prefix_cache=prefix_cache_for(target, cache_bytes))
    if mode == "hybrid":
        rt.make_scheduler = lambda: hybrid_scheduler(drafter, CURVE, 3)
    else:
        rt.make_scheduler = lambda: Scheduler(3) if drafter is not None else None
    return rt


def request(prompt, max_tokens=10, temperature=0.0, seed=0, sampler=None, stop=()) -> GenerationRequest:
    sampling = SamplingParams(temperature=temperature, seed=seed, sampler=sampler)
    return GenerationRequest("r", tuple(prompt), max_tokens, sampling, stop=stop)


def conversation(rt: Runtime, first: list[int], turns: int = 4, **kw) -> tuple[list[list[int]], list[int]]:
    """Outputs of `turns` requests, each prompt = the last prompt + its output + 3 new tokens; and
    each request's cached_tokens."""
    prompt, outs, cached = list(first), [], []
    for turn in range(turns):
        ids, _, fin = generate(rt, request(prompt, **kw))
        outs.append(ids)
        cached.append(fin.usage.cached_tokens)
        assert fin.stats.prompt_cached_tokens == fin.usage.cached_tokens
        prompt = prompt + ids + [7 + turn, 8 + turn, 9 + turn]
    return outs, cached


def prompt_of(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(10, 200, n).tolist()


@pytest.mark.parametrize("mode", MODES)
def test_multi_turn_outputs_equal_with_and_without_the_cache(tokenizer, mode):
    """4 turns, greedy: the same ids with the cache on and off, and every later turn restores all of
    the previous prompt and output but (at most) the last output token."""
    first = prompt_of(40)
    cold, none_cached = conversation(make_runtime(tokenizer, mode, 0), first)
    warm, cached = conversation(make_runtime(tokenizer, mode), first)
    assert warm == cold
    assert none_cached == [0, 0, 0, 0] and cached[0] == 0
    prompt_len = len(first)
    for turn in range(1, 4):
        assert cached[turn] >= prompt_len + len(cold[turn - 1]) - 1
        prompt_len += len(cold[turn - 1]) + 3


@pytest.mark.parametrize("sampler", ["seed-stable", "rejection"])
@pytest.mark.parametrize("mode", ["baseline", "dspark", "lookup"])
def test_seeded_outputs_equal_with_and_without_the_cache(tokenizer, mode, sampler):
    """Seeded sampling keys its noise on absolute positions, so a restored prefix changes nothing."""
    first = prompt_of(30, seed=1)
    kw = dict(temperature=1.0, seed=5, sampler=sampler)
    cold, _ = conversation(make_runtime(tokenizer, mode, 0), first, turns=3, **kw)
    warm, cached = conversation(make_runtime(tokenizer, mode), first, turns=3, **kw)
    assert warm == cold and cached[1] > 0 and cached[2] > 0


def decoder(mode: str, drafter) -> SpecDecoder:
    opts = DecodeOptions(make_sampler(SamplerSettings(), "rejection", 0), stop_ids=frozenset())
    scheduler = Scheduler(3) if drafter is not None else None
    if mode == "hybrid":
        scheduler = hybrid_scheduler(drafter, CURVE, 3)
    return SpecDecoder(TARGET, drafter, scheduler, opts, SpecStats(mode=mode, cap=3))


@pytest.mark.parametrize("generated", [1, 40])
@pytest.mark.parametrize("mode", MODES)
def test_restore_holds_the_round_invariants_and_the_cold_caches(mode, generated):
    """A state taken after the prefill (a trained drafter's context all pending) or after rounds
    restores, at every length, caches that satisfy the round invariants and hold the same K/V as a
    cold prefill of those positions (only committed tokens: rejected drafts were rolled back before
    the state was taken)."""
    drafter = drafter_for(mode)
    first = decoder(mode, drafter)
    out = first.prefill(prompt_of(20, seed=2))
    while len(out) < generated:  # rounds with rejections and roll-backs, some context absorbed
        out += first.step(3)
        first.check_invariants()
    state = first.capture()
    held = len(state.tokens)
    assert state.tokens.tolist() == first.committed[:held] and held >= len(first.committed) - 1
    lengths = {1, 7, 20, held - 5, held}
    if state.draft is not None:  # at and just past the drafter's absorbed context
        absorbed = cache_length(state.draft)
        assert absorbed == 0 if generated == 1 else 0 < absorbed < held
        lengths |= {absorbed, absorbed + 1}
    for length in sorted(lengths - {0}):
        prompt = state.tokens[:length].tolist() + [11, 12]
        warm = decoder(mode, drafter)
        warm.prefill(prompt, (state, length))
        warm.check_invariants()
        for _ in range(3):
            warm.step(3)
            warm.check_invariants()
        cold = decoder(mode, drafter)
        cold.read_prompt(prompt[:length])
        restored, _, _ = state.restore(length)
        for a, b in zip(restored, cold.target_cache):
            assert cache_length([a]) == length
            np.testing.assert_allclose(np.array(a.keys[..., :length, :]), np.array(b.keys[..., :length, :]),
                                       rtol=1e-4, atol=1e-5)


def test_cancel_during_prefill_keeps_exactly_the_chunks_read(tokenizer, monkeypatch):
    """Cancelled between prefill chunks: EngineCancelled, the cache holds the chunks read and nothing
    more, and the next request for that prompt restores them and answers as a cold run does."""
    monkeypatch.setattr(spec_module, "PREFILL_CHUNK", 8)
    rt = make_runtime(tokenizer, "dspark")
    prompt = prompt_of(40, seed=3)
    polls = iter([False, False, True])
    events = stream_generate(rt, request(prompt), cancelled=lambda: next(polls))
    with pytest.raises(EngineCancelled):
        next(events)
    assert rt.prefix_cache.usage.entries == 1 and rt.prefix_cache.usage.tokens == 16
    ids, _, fin = generate(rt, request(prompt))
    assert fin.usage.cached_tokens == 16
    cold_ids, _, _ = generate(make_runtime(tokenizer, "dspark", 0), request(prompt))
    assert ids == cold_ids


class FailingTarget:
    """The tiny target, failing its forward number `fail_at` (1-based)."""

    def __init__(self, fail_at: int):
        self.forwards, self.fail_at = 0, fail_at

    def __getattr__(self, name):
        return getattr(TARGET, name)

    def forward(self, ids, cache, taps=True, inputs=None):
        self.forwards += 1
        if self.forwards == self.fail_at:
            raise RuntimeError("boom")
        return TARGET.forward(ids, cache, taps=taps)


def test_an_error_mid_stream_leaves_no_entry(tokenizer):
    """A round that fails leaves nothing in the cache (its state may be half-updated)."""
    target = FailingTarget(fail_at=3)
    rt = make_runtime(tokenizer, "baseline", target=target)
    with pytest.raises(RuntimeError, match="boom"):
        generate(rt, request(prompt_of(20)))
    assert rt.prefix_cache.usage.entries == 0


def test_stop_string_and_max_tokens_keep_committed_tokens(tokenizer):
    """Requests ended by a stop string or by max_tokens leave states of committed tokens only."""
    rt = make_runtime(tokenizer, "dspark")
    prompt = prompt_of(20, seed=4)
    ids, text, fin = generate(rt, request(prompt, max_tokens=12))
    held = rt.prefix_cache._states[next(iter(rt.prefix_cache._states))]
    assert (prompt + ids)[: len(held.tokens)] == held.tokens.tolist()
    stop = text[2:4] if len(text) >= 4 else text
    rt.prefix_cache.clear()
    ids, _, fin = generate(rt, request(prompt, max_tokens=12, stop=(stop,)))
    held = next(iter(rt.prefix_cache._states.values()))
    assert len(held.tokens) >= len(prompt) and held.tokens.tolist()[: len(prompt)] == prompt


def state_of(tokens: list[int], mode: str = "baseline"):
    dec = decoder(mode, drafter_for(mode))
    dec.read_prompt(tokens)
    return dec.capture()


def test_eviction_keeps_bytes_under_the_bound_least_recent_first():
    """States past the budget evict the least recently used (a match refreshes); bytes never exceed it."""
    size = state_of(prompt_of(30)).nbytes
    cache = PrefixCache(int(size * 2.5))
    prompts = [prompt_of(30, seed=s) for s in range(5)]
    cache.insert(state_of(prompts[0]))
    cache.insert(state_of(prompts[1]))
    assert cache.match(prompts[0] + [1])[1] == 30  # refreshes the first
    for p in prompts[2:]:
        cache.insert(state_of(p))
        assert cache.usage.bytes <= cache.max_bytes and len(cache) == 2
    assert cache.match(prompts[1] + [1]) is None and cache.usage.evictions == 3
    assert cache.match(prompts[4] + [1])[1] == 30
    too_big = PrefixCache(size - 1)
    too_big.insert(state_of(prompts[0]))
    assert len(too_big) == 0 and too_big.usage.bytes == 0


def test_two_interleaved_conversations_both_hit(tokenizer):
    """Turns of two conversations alternate; each turn after the first restores its own history."""
    rt = make_runtime(tokenizer, "dspark")
    prompts = [prompt_of(30, seed=10), prompt_of(30, seed=11)]
    for turn in range(3):
        for c in range(2):
            ids, _, fin = generate(rt, request(prompts[c]))
            if turn:
                assert fin.usage.cached_tokens >= len(prompts[c]) - 3 - 1 - 10
                assert fin.usage.cached_tokens > 30
            prompts[c] = prompts[c] + ids + [5, 6, 7]
    assert rt.prefix_cache.usage.entries == 2  # each conversation's turns replaced its older ones


def test_a_diverging_prompt_reuses_exactly_the_common_prefix(tokenizer):
    """A prompt that shares 17 tokens with a held state restores exactly 17, and answers as cold."""
    rt = make_runtime(tokenizer, "dflash")
    a = prompt_of(40, seed=12)
    generate(rt, request(a))
    b = a[:17] + [a[17] + 1] + prompt_of(19, seed=13)
    ids, _, fin = generate(rt, request(b))
    assert fin.usage.cached_tokens == 17 and rt.prefix_cache.usage.hit_tokens == 17
    assert ids == generate(make_runtime(tokenizer, "dflash", 0), request(b))[0]


def test_a_state_and_its_extensions():
    """A held state that a new one extends is dropped; one that extends the new one is kept."""
    cache = PrefixCache(BUDGET)
    p = prompt_of(30)
    cache.insert(state_of(p[:20]))
    cache.insert(state_of(p))
    assert len(cache) == 1 and cache.usage.tokens == 30
    cache.insert(state_of(p[:10]))
    assert len(cache) == 1 and cache.usage.tokens == 30
    assert cache.match(p[:12])[1] == 11  # a shorter prompt restores its own prefix of the longer state


def test_capture_refuses_a_mismatched_drafter_context():
    """A drafter context that does not cover the target cache's positions is a bug, not a state."""
    dec = decoder("dspark", drafter_for("dspark"))
    dec.read_prompt(prompt_of(12))
    with pytest.raises(ValueError, match="drafter context covers"):
        capture(dec.committed, dec.target_cache, dec.draft_cache, dec.ctx_pending[:, :-1])


def test_cache_off_is_none_and_reports_nothing(tokenizer):
    """`0` bytes: no cache object, and requests report no cached tokens."""
    assert prefix_cache_for(TARGET, 0) is None
    rt = make_runtime(tokenizer, "dspark", 0)
    for _ in range(2):
        _, _, fin = generate(rt, request(prompt_of(20)))
        assert fin.usage.cached_tokens == 0 and fin.stats.prefill_saved_s == 0.0


def test_hits_and_misses_are_counted(tokenizer):
    """usage counts prompt tokens restored (hits) and read (misses) over all requests."""
    rt = make_runtime(tokenizer, "baseline")
    p = prompt_of(30)
    ids, _, _ = generate(rt, request(p))
    _, _, fin = generate(rt, request(p + ids + [1, 2]))
    usage = rt.prefix_cache.usage
    assert usage.hit_tokens == fin.usage.cached_tokens and usage.miss_tokens == 30 + len(p + ids) + 2 - usage.hit_tokens
    assert isinstance(fin, Finished) and usage.bytes > 0 and usage.entries == 1
