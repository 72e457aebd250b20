"""engine/native/layer.py (layer.inc): mlx-lm llama layers of quantized panels in three native calls.

A tiny random llama quantized to 4 and 8 bits, every product, its attention and its layers routed as
`--precision stored` routes the default model: the fused layers equal mlx-lm's own within float
rounding, rows of a round equal the same rows decoded alone bit for bit, they run in every layer
inside a Target and in none outside it, and layers they do not fit keep mlx-lm's path.
"""

import dataclasses

import mlx.core as mx
import mlx.nn as nn
import pytest

import engine.native as native
from engine.models.target import Target
from engine.native import attention
from engine.native.attention import route_attention
from engine.native.layer import route_layers
from engine.native.linear import route_linears
from tests.engine import tiny

VOCAB = 300


@pytest.fixture(scope="module")
def ext():
    module = native.load()
    if module is None:
        pytest.skip(native.REASON)
    return module


def quantized_llama(ext, bits: int, route: bool = True) -> nn.Module:
    """`tiny.tiny_target_model` quantized (float16-exact scales and biases, as GGUF files hold them),
    its products, attention and (with `route`) its layers routed."""
    model = tiny.tiny_target_model(seed=11, vocab=VOCAB, scale=2.0)
    nn.quantize(model, group_size=32, bits=bits)
    for _, module in model.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            module.scales = module.scales.astype(mx.float16).astype(mx.float32)
            module.biases = module.biases.astype(mx.float16).astype(mx.float32)
    route_linears(model, ext, quantized_only=True)
    route_attention(model, ext)
    if route:
        assert route_layers(model, ext) == tiny.TARGET_LAYERS
    return model


def _rel_err(a: mx.array, b: mx.array) -> float:
    return float(mx.max(mx.abs(a - b)).item() / max(float(mx.max(mx.abs(b)).item()), 1e-30))


def forwards(target: Target, chunks: list[list[int]], routed: bool) -> list[mx.array]:
    """Logits of each chunk in turn over one cache, with the routed path on or off (as if the
    routing had not run: mlx-lm's layers and attention)."""
    setattr(target.model, attention._MARK, routed)
    try:
        cache = target.make_cache()
        out = [target.logits(mx.array([chunk]), cache) for chunk in chunks]
        mx.eval(out)
        return out
    finally:
        setattr(target.model, attention._MARK, True)


@pytest.mark.parametrize("bits", [4, 8])
def test_fused_layers_equal_mlx_lms_layers(ext, bits):
    """A prompt chunk of 70 rows (the causal-softmax path), decode steps and a round of 5 through
    the fused layers equal mlx-lm's layers within 1e-5 of the logits' largest magnitude."""
    target = Target(quantized_llama(ext, bits))
    chunks = [[(13 * i) % VOCAB for i in range(70)], [5], [17], [3, 1, 4, 1, 5]]
    fused, reference = forwards(target, chunks, True), forwards(target, chunks, False)
    for i, (a, b) in enumerate(zip(fused, reference)):
        assert not mx.array_equal(a, b).item() or i == 0  # the kernels ran (rounding differs somewhere)
        assert _rel_err(a, b) < 1e-5, (i, _rel_err(a, b))


def test_round_rows_equal_rows_decoded_alone(ext):
    """Rows verified together are bit-identical to the same rows decoded one at a time (taps too)."""
    target = Target(quantized_llama(ext, 4), (1, 3))
    prompt, round_ids = [(7 * i) % VOCAB for i in range(20)], [9, 8, 7, 6, 5]

    def after_prompt():
        cache = target.make_cache()
        target.forward(mx.array([prompt]), cache)
        return cache

    together, taps = target.forward(mx.array([round_ids]), after_prompt())
    cache = after_prompt()
    alone = [target.forward(mx.array([[t]]), cache) for t in round_ids]
    for i, (logits, tap) in enumerate(alone):
        assert mx.array_equal(together[0, i], logits[0, 0]).item(), i
        assert mx.array_equal(taps[0, i], tap[0, 0]).item(), i


def test_fused_calls_run_in_every_layer_inside_a_target_only(ext):
    """Inside a Target's forward every layer makes the two calls; the model called directly makes none."""
    model = quantized_llama(ext, 4)
    calls = []

    class Spy:
        def __getattr__(self, name):
            def call(*args):
                calls.append(name)
                return getattr(ext, name)(*args)
            return call

    for layer in model.model.layers:
        object.__setattr__(layer, "_dspark_fused", dataclasses.replace(layer._dspark_fused, ext=Spy()))
    Target(model).logits(mx.array([[1, 2, 3]]), Target(model).make_cache())
    assert calls == ["llama_attention_in", "llama_attention_out"] * tiny.TARGET_LAYERS
    calls.clear()
    mx.eval(model(mx.array([[1, 2, 3]])))
    assert calls == []


def test_layers_the_calls_do_not_fit_keep_mlx_lms_layer(ext):
    """float32 products (packed panels), or a traditional RoPE, leave a layer on mlx-lm's path."""
    model = tiny.tiny_target_model(seed=11, vocab=VOCAB)
    route_linears(model, ext)  # float32 panels
    assert route_layers(model, ext) == 0
    model = quantized_llama(ext, 4, route=False)
    model.model.layers[0].self_attn.rope.traditional = True
    assert route_layers(model, ext) == tiny.TARGET_LAYERS - 1
    assert not hasattr(model.model.layers[0], "_dspark_fused")


def test_bad_layer_inputs_are_refused(ext):
    """Head counts that do not match the products, or products that do not chain, raise."""
    model = quantized_llama(ext, 4)
    f = model.model.layers[0]._dspark_fused
    x = mx.zeros((1, 2, tiny.HIDDEN))
    with pytest.raises(ValueError):
        ext.llama_attention_in(x, f.norm_in, f.eps_in, f.q, f.k, f.v, f.heads + 1, f.kv_heads, f.head_dim,
                               f.rope_base, f.rope_scale, 0)
    with pytest.raises(ValueError):  # k's product where q's belongs
        ext.llama_attention_in(x, f.norm_in, f.eps_in, f.k, f.k, f.v, f.heads, f.kv_heads, f.head_dim,
                               f.rope_base, f.rope_scale, 0)
    a = mx.zeros((1, f.heads, 2, f.head_dim))
    with pytest.raises(ValueError):  # up's product where down's belongs
        ext.llama_attention_out(a, x, f.o, f.norm_out, f.eps_out, f.gate, f.up, f.up)
    with pytest.raises(ValueError):
        ext.llama_attention_out(a, x.astype(mx.float16), f.o, f.norm_out, f.eps_out, f.gate, f.up, f.down)


def test_strided_activations_are_read_as_they_come(ext):
    """A lazy activation reaches the kernels without a contiguous-copy op in front of it; one that
    turns out strided (a transposed view) gives the same result as its contiguous copy."""
    model = quantized_llama(ext, 4)
    f = model.model.layers[0]._dspark_fused
    mx.random.seed(3)
    base = mx.random.normal((1, tiny.HIDDEN, 3))  # [B, E, L]: its swapaxes is [B, L, E], strided
    strided, dense = base.swapaxes(1, 2), mx.contiguous(base.swapaxes(1, 2))
    args = (f.norm_in, f.eps_in, f.q, f.k, f.v, f.heads, f.kv_heads, f.head_dim, f.rope_base, f.rope_scale, 4)
    for a, b in zip(ext.llama_attention_in(strided, *args), ext.llama_attention_in(dense, *args)):
        assert mx.array_equal(a, b).item()
    attn = mx.random.normal((1, 3, f.heads, f.head_dim)).swapaxes(1, 2)  # [B, H, L, D], strided
    rest = (f.o, f.norm_out, f.eps_out, f.gate, f.up, f.down)
    assert mx.array_equal(ext.llama_attention_out(attn, strided, *rest),
                          ext.llama_attention_out(mx.contiguous(attn), dense, *rest)).item()
    codes, scales, biases, n, bits, group = f.q
    assert mx.array_equal(ext.quantized_linear(strided, codes, scales, biases, n, bits, group),
                          ext.quantized_linear(dense, codes, scales, biases, n, bits, group)).item()
    keys = mx.random.normal((1, f.kv_heads, 7, f.head_dim))
    assert mx.array_equal(ext.few_row_attention(attn, keys, keys, 0.25),
                          ext.few_row_attention(mx.contiguous(attn), keys, keys, 0.25)).item()
    x = mx.random.normal((1, 2, tiny.HIDDEN)) + 1  # lazy
    assert "Contiguous" not in _graph(ext.llama_attention_in(x, *args)[0])


def _graph(array: mx.array) -> str:
    import io

    out = io.StringIO()
    mx.export_to_dot(out, array)
    return out.getvalue()


@pytest.mark.parametrize("width", [70, 9])
def test_batches_without_a_cache_equal_mlx_lms_layers(ext, width):
    """Two sequences at once with no cache (the drafter trainer's feature forwards), over the causal
    kernel's path (70 positions) and few_row_attention's (9): equal to mlx-lm's layers."""
    target = Target(quantized_llama(ext, 8))
    ids = mx.array([[(11 * i + 5 * b) % VOCAB for i in range(width)] for b in range(2)])  # [2, width]

    def logits(routed):
        setattr(target.model, attention._MARK, routed)
        try:
            return target.logits(ids)
        finally:
            setattr(target.model, attention._MARK, True)

    fused, reference = logits(True), logits(False)
    assert fused.shape == (2, width, VOCAB)
    assert _rel_err(fused, reference) < 1e-5


@pytest.mark.parametrize("offset", [0, 4000, 8000])
def test_rope_far_into_the_context(ext, offset):
    """q and k of `llama_attention_in` against RMSNorm, the product and mlx.nn.RoPE at positions up
    to 8,000: the kernel's angles are computed in double, MLX's in float32, so they part by about a
    float32 rounding of the angle (docs/native.md)."""
    model = quantized_llama(ext, 4)
    layer = model.model.layers[0]
    f, attn = layer._dspark_fused, layer.self_attn
    mx.random.seed(9)
    x = mx.random.normal((1, 3, tiny.HIDDEN))
    q, k, _ = ext.llama_attention_in(x, f.norm_in, f.eps_in, f.q, f.k, f.v, f.heads, f.kv_heads, f.head_dim,
                                     f.rope_base, f.rope_scale, offset)
    normed = layer.input_layernorm(x)
    for got, proj, heads in ((q, attn.q_proj, f.heads), (k, attn.k_proj, f.kv_heads)):
        expected = attn.rope(proj(normed).reshape(1, 3, heads, -1).transpose(0, 2, 1, 3), offset=offset)
        assert _rel_err(got, expected) < (1e-5 if offset == 0 else 1e-4), (offset, _rel_err(got, expected))
