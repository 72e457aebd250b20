"""Token origins and the per-request baseline on the tiny target.

`SpecDecoder.last_drafted` (and so `TokenEvent.drafted`) counts the accepted drafts among the tokens a
round committed: they add up to `SpecStats.accepted_tokens`, a round's last token is the target's, a
plain step has none, and a stop token among accepted drafts leaves the cut round all drafts.
`GenerationRequest.baseline` decodes one request without drafts on a speculative runtime: the same
greedy tokens, stats in baseline mode, and the prefix cache left alone.
"""

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from engine.api import EngineInfo, Finished, GenerationRequest, SamplingParams, SpecConfig
from engine.generate import stream_generate
from engine.lookup import HybridDrafter, LookupConfig, LookupDrafter
from engine.prefix_cache import PrefixCache
from engine.runtime import Runtime, hybrid_scheduler
from engine.scheduler import Scheduler
from tests.engine import tiny
from tests.engine.test_hybrid import CURVE
from tests.engine.test_spec import make_decoder

# Greedy continuations of this prompt on the tiny target copy it often (tests/engine/test_hybrid.py).
PROMPT = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]


@pytest.fixture(scope="module")
def target():
    return tiny.tiny_target(scale=4.0)


def _steps(dec, prompt, max_tokens):
    """[(committed tokens, accepted drafts among them)] per prefill/step."""
    out = [(dec.prefill(prompt), dec.last_drafted)]
    total = len(out[0][0])
    while total < max_tokens and not dec.done:
        new = dec.step(max_tokens - total)
        out.append((new, dec.last_drafted))
        total += len(new)
    return out


@pytest.mark.parametrize("drafter", ["oracle", "wrong", "lookup", "hybrid", None])
def test_drafted_counts_the_accepted_drafts(target, drafter):
    """Per round: the first `last_drafted` tokens were accepted drafts and the last is the target's;
    over the request they add up to the accepted tokens of the stats (none in baseline)."""
    lookup = LookupDrafter(LookupConfig(max_drafts=4))
    both = HybridDrafter(tiny.dspark_drafter(), lookup)
    drafters = {"oracle": tiny.OracleDrafter(target), "wrong": tiny.OracleDrafter(target, shift=1),
                "lookup": lookup, "hybrid": both, None: None}
    scheduler = hybrid_scheduler(both, CURVE) if drafter == "hybrid" else None
    dec = make_decoder(target, drafters[drafter], 4 if drafter else None, scheduler=scheduler)
    steps = _steps(dec, PROMPT, 24)
    assert steps[0][1] == 0  # the prefill's token is the target's
    assert all(0 <= drafted <= len(new) - 1 for new, drafted in steps)
    assert sum(drafted for _, drafted in steps) == dec.stats.accepted_tokens
    if drafter in ("oracle", "lookup", "hybrid"):
        assert dec.stats.accepted_tokens > 0
    else:
        assert dec.stats.accepted_tokens == 0


def test_stop_among_accepted_drafts_leaves_only_drafts(target):
    """A stop token inside an accepted block cuts the round there: every token it kept was a draft."""
    plain = [t for new, _ in _steps(make_decoder(target, None, None), PROMPT, 20) for t in new]
    stop = plain[6]
    dec = make_decoder(target, tiny.OracleDrafter(target), 4, stop_ids=[stop])
    new, drafted = _steps(dec, PROMPT, 20)[-1]
    assert new[-1] == stop and drafted == len(new)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return load_tokenizer(default_model_dir)


def _lookup_runtime(tokenizer, target) -> Runtime:
    info = EngineInfo(model_id="tiny", model_path="-", mode="lookup", drafter=None, cap=4, context_length=128,
                      sampler="rejection", drafter_kind="lookup")
    runtime = Runtime(target, LookupDrafter(LookupConfig(max_drafts=4)), tokenizer, info, frozenset(),
                      SpecConfig(mode="lookup", max_draft=4), prefix_cache=PrefixCache(64 * 2**20))
    runtime.make_scheduler = lambda: Scheduler(4)
    return runtime


def _request(runtime, baseline: bool):
    request = GenerationRequest("r", tuple(PROMPT), 24, SamplingParams(temperature=0.0), baseline=baseline)
    *events, finished = stream_generate(runtime, request)
    assert isinstance(finished, Finished)
    return events, finished


def test_events_say_drafted_and_baseline_requests_draft_nothing(tokenizer, target):
    """Through the request loop: TokenEvent.drafted adds up to the accepted drafts; a baseline request
    on the same lookup runtime gives the same greedy tokens with no drafts, in baseline mode, and
    neither reads nor fills the prefix cache."""
    runtime = _lookup_runtime(tokenizer, target)
    events, finished = _request(runtime, baseline=False)
    assert sum(e.drafted for e in events) == finished.stats.accepted_tokens > 0
    assert finished.stats.mode == "lookup"
    cache = runtime.prefix_cache
    held, hits = cache.usage.entries, cache.usage.hit_tokens
    assert held > 0  # the speculative request left its state
    base_events, base = _request(runtime, baseline=True)
    assert [t for e in base_events for t in e.token_ids] == [t for e in events for t in e.token_ids]
    assert all(e.drafted == 0 for e in base_events)
    assert (base.stats.mode, base.stats.cap, base.stats.drafted_tokens, base.stats.rounds) == (
        "baseline", None, 0, finished.usage.completion_tokens - 1)
    assert base.usage.cached_tokens == 0 and (cache.usage.entries, cache.usage.hit_tokens) == (held, hits)
