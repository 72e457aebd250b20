"""Targets loaded through mlx-vlm: a tiny random Gemma-4 (sliding-window layers of 8 positions,
K/V-sharing layers, per-layer inputs) decodes through our rounds exactly as mlx-vlm's own plain
generation does, in baseline, lookup and DSpark modes."""

import hashlib

import mlx.core as mx
import pytest

from engine.lookup import LookupConfig, LookupDrafter
from engine.vision import vision_for
from tests.engine import tiny_gemma as tg
from tests.engine.test_spec import TIE_EPS, first_divergence, make_decoder, run

pytest.importorskip("mlx_vlm")

PROMPTS = [[(7 * i + 13 * j) % 280 + 2 for j in range(3 + 2 * i)] for i in range(10)]
TOKENS = 64


@pytest.fixture(scope="module")
def model():
    return tg.tiny_gemma4(seed=0, scale=2.0)


@pytest.fixture(scope="module")
def reference(model):
    """mlx-vlm's plain greedy generation (`generate_step`, its own rotating caches) per prompt."""
    from mlx_vlm.generate.ar import generate_step

    out = []
    for prompt in PROMPTS:
        steps = generate_step(mx.array([prompt]), model, None, None, max_tokens=TOKENS, temperature=0.0)
        out.append([int(token) for (token, _), _ in zip(steps, range(TOKENS))])
    return out


def top2_gap(target, ids):
    top = mx.sort(target.logits(mx.array([ids]))[0, -1])[-2:].tolist()
    return top[1] - top[0]


def assert_same_or_tie(target, prompt, expected, got, label):
    i = first_divergence(expected, got)
    if i is not None:
        gap = top2_gap(target, prompt + expected[:i])
        assert gap <= TIE_EPS, f"{label}: diverged at {i} with top-2 gap {gap}"
    assert len(got) == len(expected), label


@pytest.fixture(scope="module")
def gemma_drafter(tmp_path_factory):
    return tg.gemma_dspark_drafter(tmp_path_factory.mktemp("gemma4-dspark"))


# Drafter layouts that are not the Gemma-4 checkpoint's: the round machinery they share is the
# same, so they run over fewer prompts.
EXTRA_LAYOUTS = ("qwen3-dspark-cap1", "dflash-cap2")


@pytest.fixture(scope="module")
def drafters(gemma_drafter, model):
    """Every mode: baseline, lookup, DSpark with the Gemma-4 layout's drafter and a Qwen3-layout one, and
    a z-lab DFlash drafter bound to the target's (scaled) embedding and (soft-capped) head."""
    return {
        "baseline": (None, None),
        "lookup-cap4": (LookupDrafter(LookupConfig(min_ngram=1, max_ngram=3, max_drafts=4)), 4),
        "gemma4-dspark-cap3": (gemma_drafter, 3),
        "qwen3-dspark-cap1": (tg.random_dspark_drafter(), 1),
        "dflash-cap2": (tg.random_dflash_drafter(model), 2),
    }


def test_greedy_equals_mlx_vlm_generation(model, reference, drafters):
    """10 prompts x 64 tokens: every mode's greedy output is mlx-vlm's (ties reported), round
    invariants hold, and rounds did roll back across the window edge. The two drafter layouts
    beside the Gemma-4 one (EXTRA_LAYOUTS) take the first 3 prompts."""
    target = tg.gemma_target(model)
    target.check_taps()
    rolled_back = 0
    for name, (drafter, cap) in drafters.items():
        cases = list(zip(PROMPTS, reference))[: 3 if name in EXTRA_LAYOUTS else None]
        for prompt, expected in cases:
            dec = make_decoder(target, drafter, cap)
            got = run(dec, prompt, TOKENS)
            assert_same_or_tie(target, prompt, expected, got, f"{name} {prompt}")
            rolled_back += dec.stats.drafted_tokens - dec.stats.accepted_tokens
    assert rolled_back > 100  # rejections happened, far past the 8-position window


def image_inputs(seed):
    from engine.api import ImageInput

    data = tg.png(seed)
    return ImageInput(data, hashlib.sha256(data).hexdigest(), "image/png")


@pytest.fixture(scope="module")
def image_cases(model):
    """(expanded ids, prompt inputs, mlx-vlm's greedy tokens) for 10 prompts with one image each."""
    from mlx_vlm.generate.ar import generate_step

    vision = vision_for(model, tg.TinyProcessor())
    cases = []
    for i, prompt in enumerate(PROMPTS):
        ask = prompt[:2] + [tg.IMAGE_TOKEN] + prompt[2:]
        image = (image_inputs(i),)
        expanded = vision.expand(ask, image)
        pixels, _ = vision._preprocess(image)
        steps = generate_step(mx.array([expanded.ids]), model, pixels, None, max_tokens=TOKENS, temperature=0.0,
                              mm_token_type_ids=expanded.inputs.extra["mm_token_type_ids"])
        cases.append((expanded, [int(token) for (token, _), _ in zip(steps, range(TOKENS))]))
    return cases


def test_greedy_with_an_image_equals_mlx_vlm_generation(model, image_cases, reference, drafters):
    """10 prompts with one image x 64 tokens: the image is read through the vision tower (the answers
    differ from the text-only ones) and every mode's greedy output is mlx-vlm's."""
    target = tg.gemma_target(model)
    assert sum(case[1] != ref for case, ref in zip(image_cases, reference)) >= 5
    image_modes = ("baseline", "lookup-cap4", "gemma4-dspark-cap3")  # the drafter kinds; text covers the rest
    for name, (drafter, cap) in ((name, drafters[name]) for name in image_modes):
        for expanded, expected in image_cases:
            dec = make_decoder(target, drafter, cap)
            got = dec.prefill(expanded.ids, None, None, expanded.inputs)
            while len(got) < TOKENS and not dec.done:
                got += dec.step(TOKENS - len(got))
                dec.check_invariants()
            assert_same_or_tie(target, expanded.ids, expected, got, f"{name} image")


def test_the_placeholder_becomes_the_image_block(model):
    vision = vision_for(model, tg.TinyProcessor())
    expanded = vision.expand([5, tg.IMAGE_TOKEN, 6, tg.IMAGE_TOKEN], (image_inputs(0), image_inputs(1)))
    block = [tg.BOI_TOKEN] + [tg.IMAGE_TOKEN] * 4 + [tg.EOI_TOKEN]
    assert expanded.ids == [5, *block, 6, *block]
    assert expanded.inputs.embeds.shape == (1, len(expanded.ids), tg.HIDDEN)


def test_an_undecodable_image_is_a_clear_input_error(model):
    from engine.api import EngineInputError, ImageInput

    vision = vision_for(model, tg.TinyProcessor())
    with pytest.raises(EngineInputError, match="could not be decoded"):
        vision.expand([5, tg.IMAGE_TOKEN], (ImageInput(b"not an image", "x"),))
