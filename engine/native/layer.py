"""mlx-lm llama layers of quantized panels in three native calls around their KV cache (layer.inc).

A routed layer runs `llama_attention_in` (RMSNorm, q/k/v, RoPE), the cache's own update, the
module's attention (`few_row_attention` or the causal kernel where engine.native.attention routed
it) and `llama_attention_out` (o, residual, RMSNorm, gate/up, SiLU, down, residual): about six MLX
ops a layer instead of twenty-odd, whose dispatch and allocation weigh on a small model's decode
step (measured in docs/native.md). Like the attention kernels, the fused path runs
only while a routed `Target`'s forward runs on this thread (`engine.native.attention.active`); the
model called directly keeps mlx-lm's layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from engine import native
from engine.native import attention
from engine.native.linear import QuantizedPanelLinear

_ATTRIBUTE = "_dspark_fused"
_ORIGINAL_CALL = llama.TransformerBlock.__call__


@dataclass(frozen=True)
class _Fused:
    """What a routed layer's two calls read: norms as float32, products as (codes, scales, biases,
    outputs, bits, group size), head geometry and RoPE."""
    ext: object
    norm_in: mx.array  # [E]
    eps_in: float
    norm_out: mx.array  # [E]
    eps_out: float
    q: tuple
    k: tuple
    v: tuple
    o: tuple
    gate: tuple
    up: tuple
    down: tuple
    heads: int
    kv_heads: int
    head_dim: int
    rope_base: float
    rope_scale: float


def route_layers(model: nn.Module, ext) -> int:
    """Mark each mlx-lm llama layer of `model` whose seven products are quantized panels, whose
    norms are RMSNorm and whose RoPE is mlx's plain one over the whole head: those layers run the
    fused calls (`_call`). Returns how many layers were routed."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    routed = 0
    for layer in layers:
        fused = _fused(layer, ext)
        if fused is not None:
            object.__setattr__(layer, _ATTRIBUTE, fused)  # a plain attribute: not a parameter
            routed += 1
    if routed:
        llama.TransformerBlock.__call__ = _call
    return routed


def _fused(layer: nn.Module, ext) -> _Fused | None:
    if type(layer) is not llama.TransformerBlock:
        return None
    attn, mlp = layer.self_attn, layer.mlp
    products = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    rope = attn.rope
    if not all(isinstance(p, QuantizedPanelLinear) for p in products) or type(rope) is not nn.RoPE:
        return None
    if rope.traditional or rope.dims != attn.head_dim or attn.n_heads % attn.n_kv_heads:
        return None
    widths = ((attn.q_proj, attn.n_heads), (attn.k_proj, attn.n_kv_heads), (attn.v_proj, attn.n_kv_heads))
    if any(p.out_features != heads * attn.head_dim for p, heads in widths):
        return None
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if not all(type(n) is nn.RMSNorm for n in norms):
        return None
    q, k, v, o, gate, up, down = ((p.codes, p.scales, p.biases, p.out_features, p.bits, p.group_size)
                                  for p in products)
    norm_in, norm_out = (n.weight.astype(mx.float32) for n in norms)
    mx.eval(norm_in, norm_out)
    return _Fused(ext, norm_in, float(norms[0].eps), norm_out, float(norms[1].eps), q, k, v, o, gate, up, down,
                  attn.n_heads, attn.n_kv_heads, attn.head_dim, float(rope.base), float(rope.scale))


def _call(self, x: mx.array, mask=None, cache=None) -> mx.array:
    """llama.TransformerBlock.__call__ for every layer: the fused calls for a routed layer while its
    Target's forward runs on this thread, mlx-lm's own layer otherwise."""
    fused = getattr(self, _ATTRIBUTE, None)
    if fused is None or not attention.routed_here() or x.dtype != mx.float32 or x.ndim != 3:
        return _ORIGINAL_CALL(self, x, mask, cache)
    offset = cache.offset if cache is not None else 0
    if not isinstance(offset, int):  # a batch cache's per-sequence offsets
        return _ORIGINAL_CALL(self, x, mask, cache)
    f, threads = fused, native.kernel_threads()
    queries, keys, values = f.ext.llama_attention_in(
        x, f.norm_in, f.eps_in, f.q, f.k, f.v, f.heads, f.kv_heads, f.head_dim, f.rope_base, f.rope_scale, offset,
        threads)  # [B, H, L, D], [B, Hkv, L, D] x 2
    if cache is not None:
        keys, values = cache.update_and_fetch(keys, values)
    # mlx-lm llama's attention function, looked up now: engine.native.attention's kernels where it
    # routed them.
    out = llama.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=self.self_attn.scale,
                                             mask=mask)  # [B, H, L, D]
    return f.ext.llama_attention_out(out, x, f.o, f.norm_out, f.eps_out, f.gate, f.up, f.down, threads)
