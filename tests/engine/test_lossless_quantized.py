"""Losslessness at stored precision (issue 25): test_lossless.py's exact-distribution test on a
4-bit target whose products all run through the native kernel's quantized panels, its attention
and layers through the native calls, and a negative control. The exact law is computed on the same routed target, so the test is about the rounds,
not about how close 4 bits come to float32."""

import mlx.core as mx
import mlx.nn as nn
import pytest

from engine import native
from engine.api import SpecStats
from engine.models.target import Target
from engine.native.attention import route_attention
from engine.native.layer import route_layers
from engine.native.linear import QuantizedPanelLinear, route_linears
from engine.samplers import make_sampler
from engine.scheduler import Scheduler
from engine.spec import DecodeOptions, SpecDecoder
from tests.engine import drafter_fixtures as fx
from tests.engine import joint, tiny
from tests.engine.test_lossless import BUDGET, DRAFTER, L, PROMPT, T1, V, BonusFromQ
from tests.stats import assert_detected, assert_fits


@pytest.fixture(scope="module")
def quantized_target() -> Target:
    """test_lossless's tiny target quantized to 4 bits (float16 scales and biases, as GGUF files
    store them), every product routed through the quantized panels."""
    ext = native.load()
    if ext is None:
        pytest.skip(native.REASON)
    model = tiny.tiny_target_model(seed=7, vocab=V, scale=3.0)
    nn.quantize(model, group_size=32, bits=4)
    for _, module in model.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            module.scales = module.scales.astype(mx.float16).astype(mx.float32)
            module.biases = module.biases.astype(mx.float16).astype(mx.float32)
    route_linears(model, ext, quantized_only=True)
    assert sum(isinstance(m, QuantizedPanelLinear) for _, m in model.named_modules()) == tiny.TARGET_LAYERS * 7 + 1
    # Attention and layers as `--precision stored` routes them (engine.native.linear.use_native).
    assert route_attention(model, ext) == tiny.TARGET_LAYERS
    assert route_layers(model, ext) == tiny.TARGET_LAYERS
    return Target(model, tuple(fx.TAPS))


def sample(target: Target, scheduler_cap: int, n: int, sampler_cls=None):
    """Joint cells of n speculative generations on `target` (test_lossless.sample_joint's design)."""
    make = sampler_cls or (lambda s, seed: make_sampler(s, "rejection", seed))
    template = SpecDecoder(target, DRAFTER, Scheduler(scheduler_cap), DecodeOptions(make(T1, 0), frozenset()),
                           SpecStats(mode="dspark", cap=scheduler_cap))
    template.read_prompt(PROMPT)
    fork = lambda seed: (DecodeOptions(make(T1, seed), frozenset()), Scheduler(scheduler_cap),  # noqa: E731
                         SpecStats(mode="dspark", cap=scheduler_cap))
    return joint.sample_cells(template, fork, n, BUDGET, V, L)


def test_joint_distribution_at_stored_precision(quantized_target):
    """T=1, cap 4: the rounds on the 4-bit routed target fit its exact joint law."""
    assert_fits(sample(quantized_target, 4, joint.DRAWS), joint.exact_joint(quantized_target, PROMPT, T1, V, L))


def test_control_no_bonus_at_stored_precision(quantized_target):
    """Negative control: the bonus redrawn from q is detected on the same target."""
    exact = joint.exact_joint(quantized_target, PROMPT, T1, V, L)
    assert_detected(sample(quantized_target, 1, joint.DRAWS_FAR, sampler_cls=BonusFromQ), exact)
