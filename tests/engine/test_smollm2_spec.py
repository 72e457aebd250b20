"""Speculative decoding on the real default model (SmolLM2-135M, fp32): tie-aware greedy
equivalence over 20 prompts x 128 tokens."""

import mlx.core as mx

from engine.api import SpecStats
from engine.models.target import Target
from engine.sampling import SamplerSettings
from engine.scheduler import Scheduler
from engine.samplers import make_sampler
from engine.spec import DecodeOptions, SpecDecoder
from engine.text import apply_chat_template
from tests.engine import tiny
from tests.engine.references import cached_plain_greedy, plain_greedy
from tests.engine.smollm2_cases import QUESTIONS

TIE_EPS = 1e-4


def test_greedy_equivalence_20_prompts(default_target, default_model_dir):
    """Speculative greedy ids equal mlx-lm greedy ids; any divergence is at a measured near-tie."""
    model, tok = default_target
    target = Target(model, (2, 14, 26))
    divergences = []
    for i, question in enumerate(QUESTIONS):
        prompt = apply_chat_template(tok, [{"role": "user", "content": question}])
        plain = cached_plain_greedy(default_model_dir, model, prompt, 128)  # mlx-lm's greedy decode
        # Replay the reference with every 3rd/4th/7th position corrupted: mixed accept lengths,
        # rejections, roll-backs and bonus tokens (a period of 5 = cap + 1 would always hit the bonus).
        drafter = tiny.OracleDrafter(target, reference=prompt + plain, corrupt_every=(3, 4, 7)[i % 3], vocab=49152)
        opts = DecodeOptions(make_sampler(SamplerSettings(), "rejection", 0), stop_ids=frozenset())
        dec = SpecDecoder(target, drafter, Scheduler(4), opts, SpecStats(mode="dspark", cap=4))
        drafter.committed = dec.committed_view()
        out = dec.prefill(prompt)
        while len(out) < len(plain) and not dec.done:
            out += dec.step(len(plain) - len(out))
            dec.check_invariants()
        assert 0 < dec.stats.accepted_tokens < dec.stats.drafted_tokens
        k = next((j for j, (a, b) in enumerate(zip(plain, out)) if a != b), None)
        if k is not None:
            top = mx.sort(model(mx.array([prompt + plain[:k]]))[0, -1])[-2:].tolist()
            divergences.append((i, k, top[1] - top[0]))
    print(f"greedy divergences (prompt, position, top-2 gap): {divergences}")
    assert all(gap <= TIE_EPS for _, _, gap in divergences), divergences


def test_cached_reference_is_mlx_lm_greedy(default_target, default_model_dir):
    """The cached reference agrees with a fresh mlx-lm greedy decode (a stale cache would fail here)."""
    model, tok = default_target
    prompt = apply_chat_template(tok, [{"role": "user", "content": QUESTIONS[0]}])
    assert cached_plain_greedy(default_model_dir, model, prompt, 128)[:16] == plain_greedy(model, prompt, 16)
