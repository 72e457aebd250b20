"""Lookup across requests (`--lookup-history`, engine/lookup.py `LookupHistory`): the bounded index
against a brute-force search of the tokens it still holds, exact eviction, its memory estimate, and
a second request drafted from the first one's output with identical greedy ids (and no history
drafts with it off), on the tiny model and through the runtime on SmolLM2."""

import random
import tracemalloc

import pytest

from engine.api import EngineConfig, EngineInfo, GenerationRequest, SamplingParams, SpecConfig, SpecStats
from engine.generate import generate
from engine.lookup import SEPARATOR, LookupConfig, LookupDrafter, LookupHistory, NgramIndex
from engine.runtime import build_runtime
from engine.sampling import SamplerSettings
from engine.samplers import make_sampler
from engine.scheduler import Scheduler
from engine.spec import DecodeOptions, SpecDecoder
from engine.text import apply_chat_template
from tests.engine import tiny

# ---------------------------------------------------------------- the bounded index


def held_stream(outputs: list[list[int]], budget: int) -> list[int]:
    """What the history should hold: each output after a separator, the last `budget` tokens."""
    stream = []
    for out in outputs:
        if out:
            stream += [SEPARATOR] + out
    return stream[-budget:]


def brute_force(held: list[int], context: list[int], limit: int, min_n: int = 2, max_n: int = 3) -> list[int]:
    """The specification, by rescanning the held tokens: for n = max_n..min_n, the latest occurrence
    of the context's last n tokens lying wholly in one output with a token after it in that output;
    copy from there up to `limit` tokens or the output's end."""
    if limit <= 0:
        return []
    for n in range(max_n, min_n - 1, -1):
        if len(context) < n:
            continue
        suffix = context[-n:]
        for start in range(len(held) - 1, n - 1, -1):  # start = where the continuation begins
            gram = held[start - n : start]
            if gram == suffix and SEPARATOR not in gram and held[start] != SEPARATOR:
                out = []
                for token in held[start : start + limit]:
                    if token == SEPARATOR:
                        break
                    out.append(token)
                return out
    return []


@pytest.mark.parametrize("vocab,budget", [(3, 10), (4, 25), (6, 60), (5, 1000)])
def test_history_equals_a_rescan_of_what_it_holds(vocab, budget):
    """Outputs of random lengths are added until many have been evicted; after each, every proposal
    for random contexts equals the brute-force search of the held tokens, nothing more is held than
    the budget, and the tables hold no entry per n beyond one per held token."""
    rng = random.Random(vocab * 1000 + budget)
    history, outputs = LookupHistory(budget), []
    for _ in range(40):
        out = [rng.randrange(vocab) for _ in range(rng.randint(0, 12))]
        history.add(out)
        outputs.append(out)
        held = held_stream(outputs, budget)
        assert list(history._tokens) == held and len(history) <= budget
        assert history.usage.tokens == len(held)
        assert all(len(table) <= len(held) for table in history._next.values())
        for _ in range(10):
            context = [rng.randrange(vocab) for _ in range(rng.randint(0, 4))]
            limit = rng.randint(0, 9)
            assert history.propose(context, limit) == brute_force(held, context, limit), (held, context, limit)


def test_eviction_never_copies_from_dropped_tokens():
    """Once an output's tokens are evicted its n-grams no longer match; a later occurrence that is
    still held keeps matching after an earlier one is evicted."""
    history = LookupHistory(budget=8)
    history.add([1, 2, 3, 4])  # held: | 1 2 3 4
    assert history.propose([1, 2], 4) == [3, 4]
    history.add([5, 6, 7])  # held: | 1 2 3 4 | 5 6 7 (8 tokens)
    history.add([8, 9])  # 3 evicted: | 1 2 gone, (1, 2) -> 3 must not match
    assert list(history._tokens) == [3, 4, SEPARATOR, 5, 6, 7, SEPARATOR, 8, 9][-8:]
    assert history.propose([1, 2], 4) == [] and history.propose([5, 6], 4) == [7]
    again = LookupHistory(budget=12)
    again.add([1, 2, 3])
    again.add([1, 2, 9, 9, 9])  # the later (1, 2) -> 9 overwrote the entry
    again.add([4, 4, 4])  # evicts the first output: the second's (1, 2) stays
    assert again.propose([0, 1, 2], 3) == [9, 9, 9]


def test_output_longer_than_the_budget_keeps_its_end():
    """An output longer than the budget leaves only its last tokens, still matched."""
    history = LookupHistory(budget=5)
    history.add(list(range(10, 30)))
    assert list(history._tokens) == list(range(25, 30))
    assert history.propose([25, 26], 5) == [27, 28, 29] and history.propose([10, 11], 5) == []


def test_own_context_is_preferred_to_the_history():
    """A request's own match wins even when the history has a longer one; without an own match the
    history drafts, and the index says where the proposal came from."""
    history = LookupHistory(budget=100)
    history.add([7, 1, 2, 40, 41])
    index = NgramIndex(2, 3, history)
    index.extend([1, 2, 30, 5, 7, 1, 2])  # own: (1, 2) -> 30; history: (7, 1, 2) -> 40, a 3-gram
    assert index.propose(2) == [30, 5] and index.last_source == "context"
    index = NgramIndex(2, 3, history)
    index.extend([9, 7, 1, 2])
    assert index.propose(2) == [40, 41] and index.last_source == "history"
    index.extend([99, 98])
    assert index.propose(2) == [] and index.last_source is None
    assert index.copy().history is history  # forks share the server's history


def test_memory_estimate_is_close_to_what_is_allocated():
    """`approx_bytes` is within a factor 1.5 of the memory tracemalloc sees the history allocate."""
    rng = random.Random(0)
    outputs = [[rng.randrange(1000, 49152) for _ in range(400)] for _ in range(30)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    history = LookupHistory(budget=8000)
    for out in outputs:
        history.add(out)
    allocated = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert history.usage.tokens == 8000 and 1 / 1.5 < history.usage.approx_bytes / allocated < 1.5, (
        history.usage.approx_bytes, allocated)


def test_budget_must_be_positive():
    with pytest.raises(ValueError):
        LookupHistory(0)


# ---------------------------------------------------------------- a second request drafted from the first


def greedy_lookup(target, prompt, history, n=40):
    """Greedy ids of n tokens with lookup drafts (fixed cap 4) and the request's stats."""
    drafter = LookupDrafter(LookupConfig(max_drafts=4), history)
    stats = SpecStats(mode="lookup", cap=4)
    opts = DecodeOptions(make_sampler(SamplerSettings(), "rejection", 0), stop_ids=frozenset())
    dec = SpecDecoder(target, drafter, Scheduler(4), opts, stats)
    out = dec.prefill(prompt)
    while len(out) < n:
        out += dec.step(n - len(out))
        dec.check_invariants()
    return out, stats


def test_second_request_is_drafted_from_the_first_ones_output():
    """With the history on, a request repeating an earlier output gets drafts from it, all accepted
    at greedy, and the same ids; with it off, none of its drafts come from a history."""
    target = tiny.tiny_target(scale=4.0)
    prompt = [5, 71, 33, 18, 240, 9]
    alone, off_stats = greedy_lookup(target, prompt, None)
    history = LookupHistory(budget=1000)
    first, first_stats = greedy_lookup(target, prompt, history)
    history.add(first)
    second, stats = greedy_lookup(target, prompt, history)
    kind = stats.by_kind["lookup"]
    assert first == alone and second == alone
    assert first_stats.by_kind.get("lookup") is None or first_stats.by_kind["lookup"].history_rounds == 0
    assert kind.history_rounds > 0 and kind.history_accepted_tokens > 0
    assert all(k.history_rounds == 0 for k in off_stats.by_kind.values())


@pytest.fixture(scope="module")
def runtimes(default_model_dir):
    """Lookup runtimes of the default model with the history on (4096 tokens) and off."""
    def build(tokens: int):
        spec = SpecConfig(mode="lookup", lookup_history=tokens)
        return build_runtime(EngineConfig(model=str(default_model_dir), spec=spec))

    return build(4096), build(0)


def test_history_through_the_runtime(runtimes):
    """Through `generate` on SmolLM2: the same question twice; the second answer is drafted from the
    first (counted under history rounds) and identical; the history reports its size; off, nothing."""
    on, off = runtimes
    assert on.info.lookup_history is not None and off.info.lookup_history is None and off.history is None
    prompt = apply_chat_template(on.tokenizer, [{"role": "user", "content": "What is a decorator in Python?"}])
    request = GenerationRequest("h", tuple(prompt), 48, SamplingParams(temperature=0.0))
    ids_off, text_off, finished_off = generate(off, request)
    generate(off, request)
    first_ids, _, _ = generate(on, request)
    assert on.info.lookup_history.tokens == len(first_ids) + 1 and on.info.lookup_history.approx_bytes > 0
    ids, text, finished = generate(on, request)
    assert first_ids == ids_off and ids == ids_off and text == text_off
    kind = finished.stats.by_kind["lookup"]
    assert kind.history_rounds > 0 and kind.history_accepted_tokens > 0
    assert finished.stats.as_dict()["by_kind"]["lookup"]["history_rounds"] == kind.history_rounds
    assert all(k.history_rounds == 0 for k in finished_off.stats.by_kind.values())


def test_metrics_report_the_history(runtimes):
    """/metrics carries the history's budget, tokens and bytes gauges (read at scrape time)."""
    from prometheus_client.parser import text_string_to_metric_families

    from server.metrics import Metrics

    on, _ = runtimes

    class Engine:
        state = "ready"

        def queue_depth(self):
            return 0

        def info(self) -> EngineInfo:
            return on.info

    text = Metrics(lambda: Engine()).render().decode()
    got = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}
    usage = on.info.lookup_history
    assert got["dspark_lookup_history_budget_tokens"] == 4096
    assert got["dspark_lookup_history_tokens"] == usage.tokens and got["dspark_lookup_history_bytes"] == usage.approx_bytes


def test_health_reports_the_history(runtimes):
    """/health carries the history's size when it is on, and null when it is off."""
    from types import SimpleNamespace

    from server.routes.health import _health
    from server.settings import ServerSettings

    def health_of(runtime):
        engine = SimpleNamespace(info=lambda: runtime.info, queue_depth=lambda: 0, dead_reason=None)
        app_state = SimpleNamespace(engine=engine, settings=ServerSettings(), state="ready",
                                    drain=SimpleNamespace(draining=False))
        return _health(app_state).model_dump(mode="json")

    on, off = runtimes
    usage = on.info.lookup_history
    assert health_of(on)["lookup_history"] == {"budget_tokens": 4096, "tokens": usage.tokens,
                                               "approx_bytes": usage.approx_bytes}
    assert health_of(off)["lookup_history"] is None
