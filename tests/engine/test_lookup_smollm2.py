"""Lookup drafts on the real default model (SmolLM2-135M, fp32): tie-aware greedy identity on prompts
that copy their context, and `--mode lookup` / `auto` through the runtime and the request loop."""

import mlx.core as mx
import pytest

from engine.api import EngineConfig, GenerationRequest, SamplingParams, SpecConfig, SpecStats
from engine.generate import generate
from engine.lookup import LookupDrafter
from engine.models.target import Target
from engine.runtime import build_runtime, eos_ids
from engine.sampling import SamplerSettings
from engine.samplers import make_sampler
from engine.scheduler import Scheduler
from engine.spec import DecodeOptions, SpecDecoder
from engine.text import apply_chat_template
from tests.engine.references import cached_plain_greedy
from tests.engine.smollm2_cases import QUESTIONS

TIE_EPS = 1e-4  # as tests/engine/test_smollm2_spec.py (docs/method.md §7.1)
MAX_TOKENS = 128

FUNCTION = '''def merge_intervals(intervals):
    intervals = sorted(intervals, key=lambda pair: pair[0])
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
'''
PASSAGE = ("The Python standard library's pathlib module offers classes representing filesystem paths with "
           "semantics appropriate for different operating systems. Path classes are divided between pure paths, "
           "which provide purely computational operations without I/O, and concrete paths, which inherit from "
           "pure paths but also provide I/O operations.")
COPY_PROMPTS = [
    f"Repeat this code exactly:\n\n{FUNCTION}",
    f"Rename the function to `merge_ranges` and return the whole code:\n\n{FUNCTION}",
    f"Quote the first sentence of this passage word for word:\n\n{PASSAGE}",
    f"Rewrite this paragraph, keeping it as close to the original as possible:\n\n{PASSAGE}",
]


def decode_lookup(target, prompt, stop_ids, n=MAX_TOKENS):
    """Greedy lookup-drafted ids of up to n tokens after prompt (to the first stop id), and the
    decoder's stats (invariants checked after every round but the last)."""
    opts = DecodeOptions(make_sampler(SamplerSettings(), "rejection", 0), stop_ids=stop_ids)
    dec = SpecDecoder(target, LookupDrafter(), Scheduler(8), opts, SpecStats(mode="lookup", cap=8))
    out = dec.prefill(prompt)
    while len(out) < n and not dec.done:
        out += dec.step(n - len(out))
        if not dec.done:  # a stop inside an accepted block leaves the finished decoder's caches longer
            dec.check_invariants()
    return out, dec.stats


def until_stop(ids: list[int], stop_ids) -> list[int]:
    """ids up to and including the first stop id, as the decoder commits them."""
    end = next((i for i, t in enumerate(ids) if t in stop_ids), len(ids) - 1)
    return ids[: end + 1]


def test_greedy_lookup_equals_baseline_on_copying_prompts(default_target, default_model_dir):
    """Lookup's greedy ids equal mlx-lm's greedy ids (to the first stop); a divergence is only at a
    measured near-tie. The copying prompts really are drafted, and drafts are accepted."""
    model, tok = default_target
    target, stop_ids = Target(model), eos_ids(tok)
    divergences, accepted, drafted = [], 0, 0
    for i, text in enumerate(COPY_PROMPTS + QUESTIONS[:2]):
        prompt = apply_chat_template(tok, [{"role": "user", "content": text}])
        plain = until_stop(cached_plain_greedy(default_model_dir, model, prompt, MAX_TOKENS), stop_ids)
        spec, stats = decode_lookup(target, prompt, stop_ids)
        k = next((j for j, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
        if k is None:
            assert len(spec) == len(plain), (i, len(spec), len(plain))
        else:
            top = mx.sort(model(mx.array([prompt + plain[:k]]))[0, -1])[-2:].tolist()
            divergences.append((i, k, top[1] - top[0]))
        if i < len(COPY_PROMPTS):
            accepted, drafted = accepted + stats.accepted_tokens, drafted + stats.drafted_tokens
    print(f"greedy divergences (prompt, position, top-2 gap): {divergences}; copy prompts accepted "
          f"{accepted}/{drafted} drafts")
    assert all(gap <= TIE_EPS for _, _, gap in divergences), divergences
    assert accepted > 0.25 * drafted and accepted > 50


@pytest.fixture(scope="module")
def runtimes(default_model_dir):
    """Baseline, lookup and auto runtimes of the default model (auto has no trained drafter for it)."""
    def build(mode: str):
        return build_runtime(EngineConfig(model=str(default_model_dir), spec=SpecConfig(mode=mode)))

    return {mode: build(mode) for mode in ("baseline", "lookup", "auto")}


def test_lookup_and_auto_modes_through_the_runtime(runtimes):
    """--mode lookup serves lookup drafts with a measured zero-draft-cost curve and no taps; auto
    falls back to lookup for a target without a trained drafter, and says so."""
    lookup, auto = runtimes["lookup"], runtimes["auto"]
    assert lookup.info.mode == "lookup" and lookup.info.drafter_kind == "lookup" and lookup.info.requested_mode is None
    assert lookup.target.tap_layer_ids == () and isinstance(lookup.drafter, LookupDrafter)
    assert lookup.curve.draft_fixed_s == 0.0 and lookup.curve.draft_per_token_s == 0.0
    assert len(lookup.curve.verify_s) == lookup.drafter.config.max_drafts + 1 and 1 <= lookup.info.cap <= 8
    assert (auto.info.mode, auto.info.requested_mode, auto.info.drafter_kind) == ("lookup", "auto", "lookup")
    assert "prompt lookup" in auto.info.mode_note
    assert runtimes["baseline"].info.drafter_kind is None


def test_request_loop_in_lookup_mode_matches_baseline(runtimes):
    """Greedy requests through `generate` give baseline's text in lookup mode (adaptive cap), with
    the counters under the 'lookup' kind."""
    tok = runtimes["baseline"].tokenizer
    prompt = apply_chat_template(tok, [{"role": "user", "content": COPY_PROMPTS[0]}])
    request = GenerationRequest("t", tuple(prompt), 64, SamplingParams(temperature=0.0))
    base_ids, base_text, _ = generate(runtimes["baseline"], request)
    ids, text, finished = generate(runtimes["lookup"], request)
    assert ids == base_ids and text == base_text
    kind = finished.stats.by_kind["lookup"]
    assert finished.stats.mode == "lookup" and kind.drafted_tokens > 0 and kind.accepted_tokens > 0
    assert finished.stats.as_dict()["by_kind"]["lookup"]["rounds"] == kind.rounds
